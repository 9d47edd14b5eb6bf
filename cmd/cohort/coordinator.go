package main

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/wire"
)

// Alone, the coordinator's log is the run's record: Info by default.
var coordinatorLogLevels = logLevels{hclog.Info, hclog.Info, hclog.Debug, hclog.Trace}

func newCoordinatorCommand(g *globals) *cobra.Command {
	var listen, out, resume string
	cmd := &cobra.Command{
		Use:   "coordinator",
		Short: "Run the coordinator alone, for a run across hosts",
		Long: `Runs the coordinator alone, for a run whose workers start elsewhere
('cohort worker --coordinator HOST:PORT --rank R --world N'). Its first line
names the address it listens on. The run secret comes from --secret-file,
$COHORT_SECRET_FILE or $COHORT_SECRET, never the command line. SIGINT or
SIGTERM saves a checkpoint and stops (exit status 130); a second one
abandons the run. Exit status 0 means the run completed.

A coordinator that died (SIGKILL, a crash) can come back: started again
with --resume OUT on the same --listen address within the workers'
worker.liveness_timeout, it takes back the workers still running, their
plugins and models included, and the run goes on from its last averaging
round.

It starts no plugins, so it cannot see the workers' plugins and does not
check the trainer and averager blocks against their settings schemas: each
worker does, right after starting its plugins and before configuring them,
and 'cohort validate FILE' on a worker's host checks them ahead of the run.`,
		Example: `  COHORT_SECRET_FILE=secret cohort coordinator --config cohort.hcl --listen 10.0.0.1:7000 --out runs/a`,
		Args:    noArgs,
	}
	f := cmd.Flags()
	var ranks int
	f.StringVar(&listen, "listen", "", "control address to listen on, HOST:PORT (required; port 0 picks one)")
	f.IntVar(&ranks, "ranks", 0, "rank workers (default: the config's run.ranks); a launcher passes its task count")
	f.StringVar(&out, "out", "", "output directory (default: the config's run.out)")
	f.StringVar(&resume, "resume", "", "continue from a checkpoint, a run's out directory or its checkpoints directory")
	secretFile := secretFileFlag(cmd)
	var httpAddr string
	httpFlag(cmd, &httpAddr)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case g.configPath == "":
			return usageError("--config is required")
		case listen == "":
			return usageError("--listen is required")
		}
		cfg, err := g.loadConfig()
		if err != nil {
			return err
		}
		if cmd.Flags().Changed("ranks") {
			if err := cfg.Apply(config.Overrides{Ranks: &ranks}); err != nil {
				return usageError("%v", err)
			}
		}
		cfg.Coordinator.Listen = listen
		if err := cfg.Validate(); err != nil {
			return configError(fmt.Errorf("--listen: %w", err))
		}
		if err := applyHTTPFlag(cmd, cfg, httpAddr); err != nil {
			return err
		}
		secret, err := loadSecret(*secretFile)
		if err != nil {
			return failed(err)
		}
		keys, err := wire.DeriveKeys(secret)
		if err != nil {
			return failed(err)
		}
		prog := newProgressPrinter(os.Stdout, false, progressEvery)
		defer prog.close()
		coord, err := coordinator.New(coordinator.Options{
			Config:   cfg,
			Keys:     keys,
			Out:      out,
			Resume:   resume,
			Logger:   g.newLogger(os.Stderr, coordinatorLogLevels),
			Progress: prog.report,
		})
		if err != nil {
			return failed(err)
		}
		// A script that asked for port 0 reads the address from here.
		prog.line(fmt.Sprintf("coordinator listening on %s (run %s, %d ranks, out %s)", coord.Addr(), coord.RunID(), cfg.Run.Ranks, coord.Out()))
		ctx, release := onSignals(context.Background(), stopRun(prog, coord.Stop, "abandon"))
		defer release()
		stopStatus, err := startStatus(cfg.Coordinator.HTTP, coord, g.newLogger(os.Stderr, coordinatorLogLevels), prog)
		if err != nil {
			return err
		}
		defer stopStatus()
		sum, err := coord.Run(ctx)
		prog.close()
		return outcome(os.Stdout, sum, err, fmt.Sprintf("%s --config %s --listen %s", cmd.CommandPath(), g.configPath, listen))
	}
	return cmd
}
