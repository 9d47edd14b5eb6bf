package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/worker"
)

// envRunChild is set to 1 by `cohort run` on the workers it launches: the
// launcher handles Ctrl-C for the whole run, so its workers ignore SIGINT
// and wait for the coordinator's ShutdownWithSave.
const envRunChild = "COHORT_RUN_CHILD"

const workerUsage = `usage: cohort worker --coordinator HOST:PORT --rank R --world N [--config FILE] [--secret-file F] [-v|-vv|-vvv]

Runs one rank worker against a coordinator. The run secret comes from
--secret-file, $COHORT_SECRET_FILE or $COHORT_SECRET, never the command line.

`

// workerCommand is `cohort worker`: exit 0 on a clean exit, 1 on an error,
// 2 on bad usage.
func workerCommand(args []string) int {
	// A worker only relays: plans to its trainer, reports to the
	// coordinator, rounds to its averager. With one P its goroutines hand
	// work to each other on one thread instead of waking idle threads
	// on the cores the trainer computes on, once per batch (measured on a
	// 2-core machine: 1-rank training 3-15% faster). $GOMAXPROCS overrides.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), workerUsage)
		fs.PrintDefaults()
	}
	coordinator := fs.String("coordinator", "", "the coordinator's control address, HOST:PORT (required)")
	rank := fs.Int("rank", -1, "this worker's global rank, 0..N-1 (required)")
	world := fs.Int("world", 0, "the number of ranks in the run (required)")
	localRanks := fs.Int("local-ranks", 1, "ranks of this run on this host; trainers share the cores among them")
	cfgPath := fs.String("config", "", "HCL config file (default: the built-in configuration)")
	secretFile := fs.String("secret-file", "", "file holding the run secret")
	v := fs.Bool("v", false, "debug logging")
	vv := fs.Bool("vv", false, "trace logging")
	vvv := fs.Bool("vvv", false, "trace logging, with the worker's time and memory profile at exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "cohort worker: "+format+"\n\n", a...)
		fs.Usage()
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected argument %q", fs.Arg(0))
	case *coordinator == "":
		return usageErr("--coordinator is required")
	case *world < 1 || int64(*world) > int64(^uint32(0)):
		return usageErr("--world must be at least 1")
	case *rank < 0 || *rank >= *world:
		return usageErr("--rank must be in 0..%d", *world-1)
	case *localRanks < 1 || *localRanks > *world:
		return usageErr("--local-ranks must be in 1..%d", *world)
	}

	level := hclog.Info
	switch {
	case *vv || *vvv:
		level = hclog.Trace
	case *v:
		level = hclog.Debug
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "cohort", Level: level, Output: os.Stderr})

	cfg := config.Default()
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath); err != nil {
			fmt.Fprintf(os.Stderr, "cohort worker: %v\n", err)
			return 1
		}
	}
	secret, err := loadSecret(*secretFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort worker: %v\n", err)
		return 1
	}

	o := worker.FromConfig(cfg)
	o.Coordinator = *coordinator
	o.Rank, o.World = uint32(*rank), uint32(*world)
	o.LocalRanks = uint32(*localRanks)
	o.Secret = secret
	o.Logger = logger
	o.Withhold = []string{envSecret, envSecretFile}
	o.PluginDirs = pluginDirs(cfg)

	signals := []os.Signal{syscall.SIGTERM}
	if os.Getenv(envRunChild) == "1" {
		signal.Ignore(os.Interrupt)
	} else {
		signals = append(signals, os.Interrupt)
	}
	ctx, stop := signal.NotifyContext(context.Background(), signals...)
	defer stop()

	if err := worker.Run(ctx, o); err != nil {
		logger.Error("worker failed", "rank", *rank, "error", err)
		return 1
	}
	return 0
}
