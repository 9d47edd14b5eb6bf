package main

import (
	"context"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/worker"
)

// envRunChild is set to 1 by `cohort run` on the workers it launches: the
// launcher handles Ctrl-C for the whole run, so its workers ignore SIGINT
// and wait for the coordinator's ShutdownWithSave.
const envRunChild = "COHORT_RUN_CHILD"

// stopGraceFactor: a signalled worker that has not stopped within this
// many shutdown graces (30 s by default) exits anyway.
const stopGraceFactor = 6

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

Under a launcher the flags may be left out: the rank, world size, ranks on
this host and the coordinator's address come from the variables it sets,
tried in this order after the flags:
  cohort      COHORT_RANK, COHORT_WORLD, COHORT_LOCAL_RANKS, COHORT_COORDINATOR
  torchrun    RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (a --coordinator or
              $COHORT_COORDINATOR of ":PORT" takes its host from MASTER_ADDR;
              MASTER_PORT is torchrun's rendezvous, never the coordinator)
  Slurm srun  SLURM_PROCID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE
  Kubernetes  JOB_COMPLETION_INDEX (an Indexed Job's pod index)

At start it removes the arenas in /dev/shm of cohort workers that are gone.`,
		Example: `  COHORT_SECRET_FILE=secret cohort worker --coordinator 10.0.0.1:7000 --rank 0 --world 8 --local-ranks 4 --config cohort.hcl
  srun --ntasks 8 env COHORT_COORDINATOR=$HEAD:7000 cohort worker --config cohort.hcl`,
		Args: noArgs,
	}
	f := cmd.Flags()
	f.StringVar(&coord, "coordinator", "", "the coordinator's control address, HOST:PORT (else from the launcher's variables)")
	f.IntVar(&rank, "rank", 0, "this worker's global rank, 0..N-1 (else from the launcher's variables)")
	f.IntVar(&world, "world", 0, "the number of ranks in the run (else from the launcher's variables)")
	f.IntVar(&localRanks, "local-ranks", 1, "ranks of this run on this host; trainers share the cores among them")
	secretFile := secretFileFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		flagged := map[string]bool{}
		for _, name := range []string{"rank", "world", "local-ranks", "coordinator"} {
			flagged[name] = cmd.Flags().Changed(name)
		}
		p, err := resolvePlacement(placement{rank: rank, world: world, localRanks: localRanks, coordinator: coord}, flagged, os.Getenv)
		if err != nil {
			return err
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
		o.Coordinator = p.coordinator
		o.Rank, o.World = uint32(p.rank), uint32(p.world)
		o.LocalRanks = uint32(p.localRanks)
		logger.Debug("placement", "rank", p.rank, "world", p.world, "local_ranks", p.localRanks, "coordinator", p.coordinator, "from", p.from)
		o.Secret = secret
		o.Logger = logger
		o.Withhold = []string{envSecret, envSecretFile}
		o.PluginDirs = pluginDirs(cfg)

		cleanup, err := useWorkerTemp(logger)
		if err != nil {
			return failed(err)
		}
		defer cleanup()

		// Under `cohort run` Ctrl-C is the launcher's to handle.
		sigs := []os.Signal{syscall.SIGTERM, os.Interrupt}
		if os.Getenv(envRunChild) == "1" {
			signal.Ignore(os.Interrupt)
			sigs = sigs[:1]
		}
		ctx, release := onSignals(context.Background(), nil, sigs...)
		defer release()
		// A signalled worker's teardown makes a few plugin calls, each
		// bounded by the shutdown grace; past a generous multiple of it
		// something is stuck, and the worker must still go (its launcher
		// may be dead). The goroutines' stacks say where it was stuck.
		grace := stopGraceFactor * max(o.ShutdownGrace, worker.DefaultShutdownGrace)
		stopWatch := stopWatchdog(ctx, grace, func() {
			logger.Error("the worker did not stop within the grace after a signal; exiting", "rank", p.rank, "grace", grace)
			pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
			cleanup()
			os.Exit(exitFailed)
		})
		defer stopWatch()
		if err := worker.Run(ctx, o); err != nil {
			logger.Error("worker failed", "rank", p.rank, "error", err)
			return failed(nil)
		}
		return nil
	}
	return cmd
}
