package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/internal/dirs"
)

// effectiveConfigFile is the config a run's workers read, written into the
// out directory: the file plus the command line's overrides.
const effectiveConfigFile = "config.hcl"

// How long workers get to exit after the coordinator is done before they
// are killed.
const childExitGrace = 15 * time.Second

// The launcher logs warnings only by default: its progress lines say the
// rest.
var runLogLevels = logLevels{hclog.Warn, hclog.Info, hclog.Debug, hclog.Trace}

func newRunCommand(g *globals) *cobra.Command {
	var ranks, epochs int
	var o config.Overrides
	var out, resume, httpAddr string
	var force bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Train on this machine: a coordinator and N rank workers",
		Long: `Trains on this machine: a coordinator in this process and N rank workers
('cohort worker' subprocesses). Flags given on the command line override the
config file. Before any rank starts it starts the trainer and averager
plugins briefly and checks the config's blocks against the settings each
declares; a mistake there (or a missing plugin) ends it with exit status 2,
as a config error does. Ctrl-C saves a checkpoint and stops (exit status 130); a second
Ctrl-C kills the workers. Exit status 0 means the run completed.

--resume continues a run: with no --config it reads the run's own config
(OUT/config.hcl, the file plus the overrides it ran with) and with no --out
it writes on into the run's directory. A new run refuses an --out directory
that holds something, unless --force.`,
		Example: `  cohort run --config cohort.hcl --ranks 4 --epochs 3 --out runs/a
  cohort run --trainer mock --averaging mock --ranks 4
  cohort run --resume runs/a`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			relayOnOneP()
			if resume != "" {
				runDir, err := resumedRunDir(resume)
				if err != nil {
					return usageError("--resume: %w", err)
				}
				if g.configPath == "" {
					if own := filepath.Join(runDir, effectiveConfigFile); fileExists(own) {
						g.configPath = own
					}
				}
				if out == "" {
					out = runDir
				}
			}
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("ranks") {
				o.Ranks = &ranks
			}
			if cmd.Flags().Changed("epochs") {
				o.Epochs = &epochs
			}
			switch {
			case out != "":
				o.Out = &out
			case cfg.Run.Out == config.Default().Run.Out:
				// The built-in default would make every run share one directory.
				stamp := "runs/" + time.Now().Format("20060102-150405")
				o.Out = &stamp
			}
			if err := cfg.Apply(o); err != nil {
				return usageError("%w", err)
			}
			if err := applyHTTPFlag(cmd, cfg, httpAddr); err != nil {
				return err
			}
			// Both halves of this run read this one config: TLS on one
			// side only would refuse every worker.
			if cfg.Coordinator.TLS.Enabled() != cfg.Worker.TLS.Enabled() {
				return usageError("%s: coordinator { tls } and worker { tls } go together in cohort run: set both or neither", cfg.Path)
			}
			if resume == "" && !force && dirs.NonEmpty(cfg.Run.Out) {
				return usageError("out directory %s already holds a run; resume it with --resume %s, pick another --out, or pass --force", cfg.Run.Out, cfg.Run.Out)
			}
			// Before any rank starts (or the out directory is made): a
			// plugin that is missing or refuses its block fails the run
			// here, every problem at once, instead of in each worker.
			if errs := checkPlugins(cmd.Context(), cfg); len(errs) > 0 {
				return configError(fmt.Errorf("the run's plugins:\n%w", errors.Join(errs...)))
			}
			l := &launcher{g: g, cfg: cfg, resume: resume}
			return l.run()
		},
	}
	f := cmd.Flags()
	f.IntVar(&ranks, "ranks", 0, "rank workers (default: the config's run.ranks)")
	f.IntVar(&epochs, "epochs", 0, "epochs (default: the config's run.epochs)")
	f.StringVar(&o.Trainer, "trainer", "", "trainer plugin name (default: the config's)")
	f.StringVar(&o.Averager, "averaging", "", "averaging plugin name (default: the config's)")
	f.StringVar(&out, "out", "", "output directory (default: runs/<timestamp>)")
	f.StringVar(&resume, "resume", "", "continue from a checkpoint, a run's out directory or its checkpoints directory")
	f.BoolVar(&force, "force", false, "write into an --out directory that already holds something")
	httpFlag(cmd, &httpAddr)
	return cmd
}

// resumedRunDir is the out directory of the run that --resume path names
// (a checkpoint, a checkpoints directory, or the out directory itself).
func resumedRunDir(path string) (string, error) {
	ckpt, err := checkpoint.ResolveCheckpoint(path)
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(ckpt)
	if filepath.Base(dir) != checkpoint.CheckpointsDir {
		return "", fmt.Errorf("checkpoint %s is not in a run's %s directory", ckpt, checkpoint.CheckpointsDir)
	}
	return filepath.Dir(dir), nil
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// launcher is one `cohort run`: the coordinator in process, the workers
// as children.
type launcher struct {
	g      *globals
	cfg    *config.Config
	resume string
}

func (l *launcher) run() error {
	stderr := &lockedWriter{w: os.Stderr}
	secret, err := newSecret()
	if err != nil {
		return failed(err)
	}
	keys, err := wire.DeriveKeys(secret)
	if err != nil {
		return failed(err)
	}
	exe, err := os.Executable()
	if err != nil {
		return failed(fmt.Errorf("find this executable for the workers: %w", err))
	}
	// The embedded coordinator serves this machine only, on any free port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return failed(fmt.Errorf("listen on 127.0.0.1:0: %w", err))
	}

	tty := isTerminal(os.Stdout)
	prog := newProgressPrinter(os.Stdout, tty, progressEvery)
	defer prog.close()
	// On a terminal the console's log lines go through the printer, above
	// the progress bar, instead of through it.
	var console io.Writer = stderr
	if tty && isTerminal(os.Stderr) {
		console = printerWriter{prog}
	}
	logs, err := openRunLogs(l.cfg.Run.Out, l.g.verbosity > 0, console)
	if err != nil {
		return failed(err)
	}
	defer logs.close()
	logger, err := logs.coordinatorLogger(l.g, runLogLevels)
	if err != nil {
		return failed(err)
	}
	formed := make(chan struct{})
	var formedOnce sync.Once
	kids := newChildren(l.cfg.Run.Ranks)
	// Whatever happens below, no worker outlives the launcher.
	defer kids.killAll()
	opts := coordinator.Options{
		Config:   l.cfg,
		Keys:     keys,
		Listener: ln,
		Resume:   l.resume,
		Logger:   logger,
		Progress: func(p coordinator.Progress) {
			if p.Kind == coordinator.ProgressFormed {
				formedOnce.Do(func() { close(formed) })
			}
			if p.Kind == coordinator.ProgressMembership && p.Event != nil && p.Event.Event == record.EventDead {
				// A rank the run has given up on may be stopped or hung, and
				// would hold the run's end for the whole exit grace; its
				// samples are the survivors' now.
				kids.kill(int(p.Event.Rank))
			}
			prog.report(p)
		},
	}
	coord, err := coordinator.New(opts)
	if err != nil {
		return failed(err)
	}
	cur := &liveCoordinator{}
	cur.p.Store(coord)
	cfgFile := filepath.Join(coord.Out(), effectiveConfigFile)
	if err := writeConfig(cfgFile, l.cfg); err != nil {
		coord.Close()
		return failed(err)
	}
	prog.line(fmt.Sprintf("run %s: %s, %s, policy %s, trainer %s, averager %s; out %s (logs in %s)",
		coord.RunID(), count(l.cfg.Run.Ranks, "rank"), count(l.cfg.Run.Epochs, "epoch"), l.cfg.Coordinator.Policy, l.cfg.Trainer.Name, l.cfg.Averager.Name, coord.Out(),
		filepath.Join(coord.Out(), LogsDir)))
	stopStatus, err := startStatus(l.cfg.Coordinator.HTTP, cur, logger, prog)
	if err != nil {
		return err
	}
	defer stopStatus()

	// From here on Ctrl-C belongs to the run: the first stops it cleanly,
	// the second abandons it.
	abandon, releaseSignals := onSignals(context.Background(), stopRun(prog, cur.Stop, "kill"))
	defer releaseSignals()
	ctx, cancel := context.WithCancelCause(abandon)
	defer cancel(nil)
	// Arenas of workers killed earlier on this host go first; those of this
	// run's workers that were killed (by a signal, or by the launcher after
	// the grace period) go last, once every worker is reaped.
	arenaLog := logger.Named("arenas")
	worker.SweepArenas("", arenaLog)
	defer worker.SweepArenas("", arenaLog)

	type runResult struct {
		sum *record.Summary
		err error
	}
	done := make(chan runResult, 1)
	runCoord := func(c *coordinator.Coordinator) {
		sum, err := c.Run(ctx)
		done <- runResult{sum, err}
	}
	go runCoord(coord)
	restarts := 0

	for r := range l.cfg.Run.Ranks {
		args := append([]string{"worker", "--coordinator", coord.Addr().String(), "--rank", strconv.Itoa(r),
			"--world", strconv.Itoa(l.cfg.Run.Ranks), "--local-ranks", strconv.Itoa(l.cfg.Run.Ranks), "--config", cfgFile},
			l.g.verbosityFlag()...)
		log, console, err := logs.rankOutput(r)
		if err == nil {
			err = kids.start(exe, args, childEnv(secret), fmt.Sprintf("rank %d", r), log, console)
		}
		if err != nil {
			cancel(fmt.Errorf("start the worker of rank %d: %w", r, err))
			break
		}
	}

	var res runResult
	abandoned := abandon.Done()
wait:
	for {
		select {
		case res = <-done:
			if next := comeBack(opts, cur.p.Load(), res.err, &restarts, prog); next != nil {
				cur.p.Store(next)
				go runCoord(next)
				continue
			}
			break wait
		case <-abandoned:
			abandoned = nil
			// The run's context is already cancelled, so it ends as
			// abandoned rather than as every rank lost.
			prog.line(fmt.Sprintf("%v; killing the workers", context.Cause(abandon)))
			kids.killAll()
		case ex := <-kids.exits:
			select {
			case <-formed:
				// After formation the coordinator sees the lost link and
				// carries on without the rank.
			default:
				cancel(fmt.Errorf("the worker of %s exited (%v) before the cohort formed", ex.name, ex.err))
			}
		}
	}

	// The coordinator has let the workers go (or given up): they get a
	// grace period to exit on their own, then are killed; any signal now
	// cuts it short. Workers of a run that never formed are only retrying
	// their connection.
	grace := time.Second
	select {
	case <-formed:
		grace = childExitGrace
	default:
	}
	cut, releaseGrace := onSignals(context.Background(), nil)
	defer releaseGrace()
	releaseSignals()
	kids.waitAll(cut, grace)
	prog.close()
	return outcome(os.Stdout, res.sum, res.err, "cohort run")
}

// writeConfig writes cfg where the workers load it.
func writeConfig(path string, cfg *config.Config) error {
	src, err := cfg.HCL()
	if err == nil {
		src = append([]byte("# Written by cohort run: the run's effective configuration.\n\n"), src...)
		err = os.WriteFile(path, src, 0o644)
	}
	if err != nil {
		return fmt.Errorf("write the run's config to %s: %w", path, err)
	}
	return nil
}
