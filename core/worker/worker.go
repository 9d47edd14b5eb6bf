package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/resources"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker/link"
	"github.com/cohortdl/cohort/core/worker/supervisor"
	"github.com/cohortdl/cohort/internal/dirs"
	sharena "github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// worker is one Run's state. link and admit are set before the
// goroutines that read them start; the main-loop fields are the main
// goroutine's alone.
type worker struct {
	o    Options
	log  hclog.Logger
	keys wire.Keys

	link       *link.Link
	admit      *wirepb.Admit
	plugins    Plugins
	sup        *supervisor.Supervisor // the plugins, their arena and checkpoints
	sampler    *resources.Sampler
	lastSample atomic.Pointer[wirepb.ResourceSample]

	queue   *queue // commands, from the inbound bridge
	plans   *planQueue
	ledger  *ledger
	mailbox mailbox
	guard   roundGuard

	// stopCtx ends when the coordinator asks for shutdown or is lost: it
	// interrupts setup and training. Commands already queued still run.
	stopCtx context.Context
	stop    context.CancelCauseFunc
	// connCtx ends with stopCtx or when the current control link is lost
	// (connLost) while the rank serves: it interrupts the plan and the
	// round under way, and a coordinator that comes back gets a new one
	// (comeback.go). serving says the rank may wait for such a comeback.
	connCtx  context.Context
	connLost context.CancelCauseFunc
	serving  atomic.Bool
	// meetKind is the averager's meeting kind (its Describe).
	meetKind string

	inboundTask, heartbeatTask, samplerTask, watchdogTask *task

	loopState
}

// Run is one rank's whole life: connect to the coordinator, join, set up
// the plugins, serve commands until Shutdown, tear down. It returns nil
// only on a clean exit (Shutdown or ShutdownWithSave handled and Exiting
// sent); every goroutine and plugin it started is gone when it returns.
func Run(ctx context.Context, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	keys, err := wire.DeriveKeys(o.Secret)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w := &worker{
		o:      o,
		log:    o.Logger.Named("worker").With("rank", o.Rank),
		keys:   keys,
		queue:  newQueue(),
		plans:  newPlanQueue(),
		ledger: newLedger(o.World),
	}
	w.plugins = o.Plugins
	if w.plugins == nil {
		w.plugins = NewHostPlugins(pluginhost.Options{
			Dirs:     o.PluginDirs,
			Logger:   o.Logger.ResetNamed(fmt.Sprintf("rank %d", o.Rank)),
			Grace:    o.ShutdownGrace,
			Withhold: o.Withhold,
			Lock:     o.PluginLock,
			Versions: map[pluginhost.Kind]string{
				pluginhost.Trainer:  o.Trainer.Version,
				pluginhost.Averager: o.Averager.Version,
			},
		})
	}
	w.sup = supervisor.New(supervisor.Config{
		Rank:          o.Rank,
		TrainerName:   o.Trainer.Name,
		AveragerName:  o.Averager.Name,
		Plugins:       w.plugins,
		Restarts:      o.PluginRestarts,
		ShutdownGrace: o.ShutdownGrace,
		ArenaDir:      o.ArenaDir,
		Logger:        w.log,
	}, supervisor.Hooks{
		Send:            w.send,
		Release:         w.releaseLost,
		TrainerReplaced: w.plans.restep,
	})
	w.loopState = newLoopState(o.World)
	SweepArenas(o.ArenaDir, w.log)
	w.stopCtx, w.stop = context.WithCancelCause(ctx)
	defer w.stop(nil)
	w.newConn()
	clean, runErr := w.run(ctx)
	return w.teardown(ctx, clean, runErr)
}

// ArenaPrefix begins the name of every arena a rank creates:
// cohort-<run id>-r<rank>, followed by the owner's pid and start time
// (shared/arena.Create).
const ArenaPrefix = "cohort"

// arenaPrefix names a rank's arena after its run and rank. The run id
// comes from the coordinator: anything but letters, digits, '.', '_' and
// '-' becomes '_', so it cannot leave the arena directory.
func arenaPrefix(runID string, rank uint32) string {
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, runID)
	if len(safe) > 64 {
		safe = safe[:64]
	}
	return ArenaPrefix + "-" + safe + "-r" + strconv.FormatUint(uint64(rank), 10)
}

// SweepArenas removes, from dir (/dev/shm when empty), the rank arenas
// whose owner is gone: a worker killed before its teardown leaves its
// arena behind, and the next cohort process on the host takes it away.
func SweepArenas(dir string, log hclog.Logger) {
	removed, err := sharena.Sweep(dir, ArenaPrefix)
	for _, p := range removed {
		log.Info("removed the arena of a process that is gone", "path", p)
	}
	if err != nil {
		log.Warn("sweep arenas", "error", err)
	}
}

// run joins the cohort and serves commands; clean reports whether the
// coordinator ended the worker by protocol (Exiting is due).
func (w *worker) run(ctx context.Context) (clean bool, err error) {
	w.link, err = link.Dial(w.stopCtx, w.linkConfig(w.o.ConnectTimeout, 0))
	if err != nil {
		return false, err
	}
	w.admit, err = w.link.AwaitAdmit(w.stopCtx)
	if errors.Is(err, link.ErrShutdownBeforeAdmit) {
		w.log.Info("coordinator ended the run before admitting this rank")
		return true, nil
	}
	if err != nil {
		return false, err
	}
	w.log.Info("admitted", "run", w.admit.GetRunId(), "seed", w.admit.GetSeed(), "resume", w.admit.GetResumeDir())

	// From here, while the plugins start (a libtorch trainer may load for
	// longer than the coordinator's heartbeat timeout), the coordinator
	// must hear from this rank and this rank must notice a lost
	// coordinator or its Shutdown. Heartbeat is the one frame sent before
	// Ready.
	w.inboundTask = goTask(ctx, func(ctx context.Context) { w.link.Read(ctx, bridge{w}) })
	w.heartbeatTask = goTask(ctx, func(ctx context.Context) { w.link.Heartbeat(ctx, w.o.HeartbeatInterval) })

	if err := w.setUp(w.stopCtx); err != nil {
		if w.stopCtx.Err() != nil {
			// Setup was interrupted by a stop; the queue says which.
			return w.finishInterrupted(ctx)
		}
		return false, err
	}
	w.watchdogTask = goTask(ctx, w.watchdog)
	if err := w.sendReady(ctx, nil); err != nil {
		return false, err
	}
	if w.o.ResourceInterval > 0 {
		w.sampler = resources.New(w.log.Named("resources"))
		w.samplerTask = goTask(ctx, func(ctx context.Context) { w.sampleResources(ctx, w.sampler) })
	}
	return w.serve(ctx)
}

// linkConfig is how this rank reaches its coordinator, retrying the
// connection for connect (pausing at most retryMax between attempts, 0
// for the link's default).
func (w *worker) linkConfig(connect, retryMax time.Duration) link.Config {
	return link.Config{
		Coordinator:     w.o.Coordinator,
		Rank:            w.o.Rank,
		World:           w.o.World,
		Keys:            w.keys,
		TLS:             w.o.TLS,
		LivenessTimeout: w.o.LivenessTimeout,
		ConnectTimeout:  connect,
		RetryMax:        retryMax,
		Stopping:        w.stopCtx.Done(),
		Logger:          w.log,
	}
}

// newConn starts the context of a new control link.
func (w *worker) newConn() { w.connCtx, w.connLost = context.WithCancelCause(w.stopCtx) }

// serve runs the main loop until the worker ends. A lost coordinator does
// not end it at once: the rank waits for one to come back (comeback) and
// serves it.
func (w *worker) serve(ctx context.Context) (clean bool, err error) {
	w.serving.Store(true)
	for {
		clean, err = w.mainLoop(ctx)
		lost := w.lostLink()
		if lost == nil || clean {
			return clean, err
		}
		if err := w.comeback(ctx, lost); err != nil {
			return false, err
		}
	}
}

// finishInterrupted handles the queue after an interrupted setup: the stop
// that interrupted it decides how the worker ends.
func (w *worker) finishInterrupted(ctx context.Context) (bool, error) {
	for {
		c, ok := w.queue.tryPop()
		if !ok {
			return false, fmt.Errorf("setup interrupted: %w", context.Cause(w.stopCtx))
		}
		switch {
		case c.err != nil:
			return false, c.err
		case isShutdown(c.msg):
			return true, nil
		case isShutdownWithSave(c.msg):
			m := c.msg.(*wirepb.ShutdownWithSave)
			return true, w.shutdownWithSave(ctx, m)
		}
	}
}

// setUp starts and configures the plugins and the arena, in the order of
// docs/protocol.md: the averager's meeting point, trainer, arena, attach,
// resume, averager.
func (w *worker) setUp(ctx context.Context) error {
	td, ad, err := w.sup.Start(ctx)
	if err != nil {
		return err
	}
	// Checked before anything is configured, so a standalone worker with a
	// mistaken block fails at once, naming the line and key.
	if w.o.CheckSettings != nil {
		if err := errors.Join(w.o.CheckSettings(plugin.KindTrainer, td.Settings),
			w.o.CheckSettings(plugin.KindAverager, ad.Settings)); err != nil {
			return fmt.Errorf("plugin settings:\n%w", err)
		}
	}
	// Asked before the trainer's Configure, which may load for long: a
	// coordinator that serves no such meeting point fails the rank at once.
	w.meetKind = ad.MeetingKind()
	endpoint, err := w.link.Relay().Meet(ctx, w.meetKind, w.o.Averager.Name)
	if err != nil {
		return err
	}

	err = w.sup.ConfigureTrainer(ctx, plugin.TrainerConfig{
		Rank:       w.o.Rank,
		WorldSize:  w.o.World,
		LocalRanks: w.o.LocalRanks,
		Seed:       w.admit.GetSeed(),
		Settings:   w.o.Trainer.Settings,
		// Rounds run beside training only with a trainer that says it can.
		OverlapRounds: w.admit.GetOverlapRounds() && slices.Contains(td.Capabilities, plugin.CapTrainsDuringRounds),
	}, arenaPrefix(w.admit.GetRunId(), w.o.Rank),
		slices.Contains(td.Capabilities, plugin.CapDeviceBlock) && slices.Contains(ad.Capabilities, plugin.CapDeviceBlock))
	if err != nil {
		return err
	}

	var from string
	if dir := w.admit.GetResumeDir(); dir != "" {
		if from, err = resumeDir(dir, w.o.Rank); err != nil {
			return err
		}
		if err := w.sup.Resume(ctx, from); err != nil {
			return err
		}
	}

	dataKey, err := w.keys.Derive(DataKeyLabel)
	if err != nil {
		return fmt.Errorf("derive averaging data key: %w", err)
	}
	return w.sup.ConfigureAverager(ctx, plugin.AveragerConfig{
		Rank:      w.o.Rank,
		WorldSize: w.o.World,
		Arena:     w.sup.ArenaDescriptor(),
		Endpoint:  averagingEndpoint(endpoint, w.o.Coordinator),
		DataKey:   dataKey,
		Settings:  w.o.Averager.Settings,
		RunID:     w.admit.GetRunId(),
		TLS:       w.o.averagerTLS(),
		Relay:     w.link.Relay(),
	}, from)
}

// averagingEndpoint completes an endpoint of the form ":port" (a reduce
// server listening on every interface of the coordinator's host) with the
// host this rank dialled the coordinator at.
func averagingEndpoint(endpoint, coordinator string) string {
	if !strings.HasPrefix(endpoint, ":") {
		return endpoint
	}
	host, _, err := net.SplitHostPort(coordinator)
	if err != nil {
		return endpoint
	}
	return net.JoinHostPort(host, endpoint[1:])
}

// resumeDir picks the checkpoint directory to load: dir/rank-<rank>, else
// the lowest-numbered rank-* directory in dir (a cohort that grew, or a
// checkpoint only some ranks wrote). Empty directories are passed over: the
// coordinator makes one per rank before the ranks save, so an empty one is a
// save that did not happen.
func resumeDir(dir string, rank uint32) (string, error) {
	own := filepath.Join(dir, "rank-"+strconv.FormatUint(uint64(rank), 10))
	if dirs.NonEmpty(own) {
		return own, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("resume: %w", err)
	}
	var ranks []uint64
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "rank-")
		if !ok || !e.IsDir() || !dirs.NonEmpty(filepath.Join(dir, e.Name())) {
			continue
		}
		if r, err := strconv.ParseUint(num, 10, 32); err == nil {
			ranks = append(ranks, r)
		}
	}
	if len(ranks) == 0 {
		return "", fmt.Errorf("resume: %s holds no rank-<N> checkpoint directory with files", dir)
	}
	return filepath.Join(dir, "rank-"+strconv.FormatUint(slices.Min(ranks), 10)), nil
}

// sendReady tells the coordinator what this rank's trainer holds; kept,
// for a coordinator that came back, what its model holds.
func (w *worker) sendReady(ctx context.Context, kept *wirepb.Kept) error {
	setup := w.sup.Setup()
	l := setup.Layout
	var params uint64
	for _, e := range l.Entries {
		if e.Role != sharena.Parameter {
			continue
		}
		n, err := e.Elements()
		if err != nil {
			return fmt.Errorf("trainer layout: %w", err)
		}
		params += n
	}
	digest := l.Digest()
	err := w.link.Send(ctx, &wirepb.Ready{
		Rank:              w.o.Rank,
		Samples:           setup.Samples,
		EvalSamples:       setup.EvalSamples,
		ParameterCount:    params,
		ParameterBytes:    l.Size,
		LayoutDigest:      digest[:],
		Trainer:           w.o.Trainer.Name,
		Averager:          w.o.Averager.Name,
		BatchSize:         setup.BatchSize,
		SoloIdentity:      w.sup.AveragerTraits().SoloIdentity,
		AdaptiveOptimizer: setup.AdaptiveOptimizer,
		Kept:              kept,
	})
	if err != nil {
		return err
	}
	w.log.Info("ready", "samples", setup.Samples, "parameters", params, "arena_bytes", l.Size)
	return nil
}

// teardown ends the worker in this order: a queued save first (the
// coordinator may already count on it), then abort the averager (a round
// stuck on a dead peer would block the rest), publish the final parameters
// into the arena, announce Exiting only on a clean exit (an error exit must
// stay visible as a death), stop the goroutines, close the link, stop the
// plugins, remove the arena. Teardown errors are logged; the result is the
// run's.
func (w *worker) teardown(ctx context.Context, clean bool, runErr error) error {
	tctx := context.WithoutCancel(ctx)
	w.endWait(time.Now())
	if runErr != nil {
		w.log.Error("rank worker failed", "error", runErr)
	}

	// 1. A ShutdownWithSave the main loop never reached.
	for {
		c, ok := w.queue.tryPop()
		if !ok {
			break
		}
		if m, ok := c.msg.(*wirepb.ShutdownWithSave); ok && !w.saved {
			if err := w.shutdownWithSave(tctx, m); err != nil {
				w.log.Error("save on ShutdownWithSave", "error", err)
			}
		}
	}

	// 2. Abort the averager.
	w.sup.AbortAverager(tctx)

	// 3. Final parameters into the arena.
	w.sup.PublishFinal(tctx)

	// 4. Exiting, as the last frame: the periodic senders stop first.
	w.samplerTask.stop()
	w.heartbeatTask.stop()
	if clean && w.link != nil {
		sctx, cancel := context.WithTimeout(tctx, w.o.ShutdownGrace)
		if err := w.link.Send(sctx, &wirepb.Exiting{Rank: w.o.Rank}); err != nil {
			w.log.Warn("send Exiting", "error", err)
		}
		cancel()
	}

	// 5. The remaining goroutines, then the link.
	w.watchdogTask.stop()
	w.inboundTask.stop()
	if w.link != nil {
		if err := w.link.Close(); err != nil {
			w.log.Debug("close control link", "error", err)
		}
	}
	if w.sampler != nil {
		w.sampler.Close()
	}

	w.logProfile()

	// 6. The plugins, then the arena they mapped.
	w.sup.StopAll(tctx)
	if runErr == nil {
		w.log.Info("rank worker exited", "clean", clean)
	}
	return runErr
}
