package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/worker"
)

// envRunChild is set to 1 by `cohort run` on the workers it launches: the
// launcher handles Ctrl-C for the whole run, so its workers ignore SIGINT
// and wait for the coordinator's ShutdownWithSave.
const envRunChild = "COHORT_RUN_CHILD"

// A worker logs at Info by default; at Trace it also logs its time and
// memory profile at exit.
var workerLogLevels = logLevels{hclog.Info, hclog.Debug, hclog.Trace, hclog.Trace}

func newWorkerCommand(g *globals) *cobra.Command {
	var coord string
	var rank, world, localRanks int
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run one rank worker against a coordinator",
		Long: `Runs one rank worker against a coordinator. The run secret comes from
--secret-file, $COHORT_SECRET_FILE or $COHORT_SECRET, never the command line.
SIGINT or SIGTERM ends the worker. Exit status 0 means it exited cleanly.
At start it removes the arenas in /dev/shm of cohort workers that are gone.`,
		Example: `  COHORT_SECRET_FILE=secret cohort worker --coordinator 10.0.0.1:7000 --rank 0 --world 8 --local-ranks 4 --config cohort.hcl`,
		Args:    noArgs,
	}
	f := cmd.Flags()
	f.StringVar(&coord, "coordinator", "", "the coordinator's control address, HOST:PORT (required)")
	f.IntVar(&rank, "rank", 0, "this worker's global rank, 0..N-1 (required)")
	f.IntVar(&world, "world", 0, "the number of ranks in the run (required)")
	f.IntVar(&localRanks, "local-ranks", 1, "ranks of this run on this host; trainers share the cores among them")
	secretFile := secretFileFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case coord == "":
			return usageError("--coordinator is required")
		case !cmd.Flags().Changed("rank"):
			return usageError("--rank is required")
		case world < 1 || int64(world) > int64(^uint32(0)):
			return usageError("--world must be at least 1")
		case rank < 0 || rank >= world:
			return usageError("--rank must be in 0..%d", world-1)
		case localRanks < 1 || localRanks > world:
			return usageError("--local-ranks must be in 1..%d", world)
		}
		relayOnOneP()
		// A worker whose launcher was killed logs into a pipe nobody reads:
		// with SIGPIPE ignored those writes fail with EPIPE instead of
		// killing the worker before its teardown removes its arena.
		signal.Ignore(syscall.SIGPIPE)
		logger := g.newLogger(os.Stderr, workerLogLevels)
		cfg, err := g.loadConfig()
		if err != nil {
			return err
		}
		secret, err := loadSecret(*secretFile)
		if err != nil {
			return failed(err)
		}

		o := worker.FromConfig(cfg)
		o.Coordinator = coord
		o.Rank, o.World = uint32(rank), uint32(world)
		o.LocalRanks = uint32(localRanks)
		o.Secret = secret
		o.Logger = logger
		o.Withhold = []string{envSecret, envSecretFile}
		o.PluginDirs = pluginDirs(cfg)

		// Under `cohort run` Ctrl-C is the launcher's to handle.
		sigs := []os.Signal{syscall.SIGTERM, os.Interrupt}
		if os.Getenv(envRunChild) == "1" {
			signal.Ignore(os.Interrupt)
			sigs = sigs[:1]
		}
		ctx, release := onSignals(context.Background(), nil, sigs...)
		defer release()
		if err := worker.Run(ctx, o); err != nil {
			logger.Error("worker failed", "rank", rank, "error", err)
			return failed(nil)
		}
		return nil
	}
	return cmd
}
