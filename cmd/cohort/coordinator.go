package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/wire"
)

const coordinatorUsage = `usage: cohort coordinator --config FILE --listen ADDR [--out DIR] [--resume DIR] [--secret-file F] [-v|-vv|-vvv]

Runs the coordinator alone, for a run whose workers start elsewhere
(` + "`cohort worker --coordinator HOST:PORT --rank R --world N`" + `). The run secret comes
from --secret-file, $COHORT_SECRET_FILE or $COHORT_SECRET, never the command
line. SIGINT or SIGTERM saves a checkpoint and stops; a second one abandons
the run. Exit status 0 means the run completed.

`

// coordinatorCommand is `cohort coordinator`.
func coordinatorCommand(args []string) int {
	verbosity, args := countVerbosity(args)
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), coordinatorUsage)
		fs.PrintDefaults()
	}
	cfgPath := fs.String("config", "", "HCL config file (required)")
	listen := fs.String("listen", "", "control address to listen on, HOST:PORT (required; port 0 picks one)")
	out := fs.String("out", "", "output directory (default: the config's run.out)")
	resume := fs.String("resume", "", "continue from a checkpoint, a run's out directory or its checkpoints directory")
	secretFile := fs.String("secret-file", "", "file holding the run secret")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitCompleted
		}
		return exitUsage
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "cohort coordinator: "+format+"\n\n", a...)
		fs.Usage()
		return exitUsage
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected argument %q", fs.Arg(0))
	case *cfgPath == "":
		return usageErr("--config is required")
	case *listen == "":
		return usageErr("--listen is required")
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "cohort coordinator: %v\n", err)
		return exitFailed
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return fail(err)
	}
	cfg.Coordinator.Listen = *listen
	if err := cfg.Validate(); err != nil {
		return fail(fmt.Errorf("--listen: %w", err))
	}
	secret, err := loadSecret(*secretFile)
	if err != nil {
		return fail(err)
	}
	keys, err := wire.DeriveKeys(secret)
	if err != nil {
		return fail(err)
	}
	// Alone, the coordinator's log is the run's record: Info by default.
	level := [...]hclog.Level{hclog.Info, hclog.Info, hclog.Debug, hclog.Trace}[verbosity]
	log := hclog.New(&hclog.LoggerOptions{Name: "cohort", Level: level, Output: os.Stderr})
	prog := newProgressPrinter(os.Stdout, false)
	defer prog.close()
	coord, err := coordinator.New(coordinator.Options{
		Config:   cfg,
		Keys:     keys,
		Out:      *out,
		Resume:   *resume,
		Logger:   log,
		Progress: prog.report,
	})
	if err != nil {
		return fail(err)
	}
	// A script that asked for port 0 reads the address from here.
	prog.line(fmt.Sprintf("coordinator listening on %s (run %s, %d ranks, out %s)", coord.Addr(), coord.RunID(), cfg.Run.Ranks, coord.Out()))

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	stopped := make(chan struct{})
	sigDone := make(chan struct{})
	defer func() {
		close(stopped)
		<-sigDone
	}()
	go func() {
		// Turns signals into Stop, then cancel; it ends with the run.
		defer close(sigDone)
		n := 0
		for {
			select {
			case sig := <-sigs:
				n++
				if n == 1 {
					prog.line(fmt.Sprintf("%v: stopping after the plans in flight; saving a checkpoint (again to abandon)", sig))
					coord.Stop()
					continue
				}
				cancel(fmt.Errorf("%v twice: run abandoned", sig))
			case <-stopped:
				return
			}
		}
	}()

	sum, err := coord.Run(ctx)
	prog.close()
	if sum == nil {
		return fail(err)
	}
	msg := "run " + sum.Status
	if sum.Checkpoint != "" {
		msg += "; last checkpoint " + sum.Checkpoint
	}
	fmt.Println(msg)
	switch sum.Status {
	case coordinator.StatusCompleted:
		return exitCompleted
	case coordinator.StatusStopped:
		return exitStopped
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort coordinator: %v\n", err)
	}
	return exitFailed
}
