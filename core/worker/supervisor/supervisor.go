// Package supervisor owns a rank's two plugins: their handles, what they
// were configured with, the parameter arena they share, the checkpoints
// they save and load, and the budget for replacing them. Recover is the one
// place a lost plugin is handled: it is replaced within the budget and the
// coordinator told, or the rank dies of it.
//
// Files: supervisor.go (start, configuration, the handles, teardown),
// replace.go (Recover and the replacements), checkpoint.go (save, load,
// and what a replacement restores), plugins.go (Plugins: processes through
// core/pluginhost, or in process).
//
// Neighbours: core/worker, its one user, runs the rank and calls in here
// for every plugin call that can lose a plugin; it tells the supervisor
// how to reach the coordinator and the rest of the rank through Hooks.
// core/pluginhost runs plugin processes; shared/plugin is the contract the
// plugins serve; shared/arena is the parameters' shared memory.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/pluginhost"
	sharena "github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// AbortTimeout bounds one Abort call into the averager.
const AbortTimeout = 5 * time.Second

// Config is what the supervisor needs of the rank's options.
type Config struct {
	Rank uint32
	// TrainerName and AveragerName name the plugins to start.
	TrainerName, AveragerName string
	// Plugins starts and stops them.
	Plugins Plugins
	// Restarts is how many times a lost plugin may be replaced.
	Restarts int
	// ShutdownGrace bounds each teardown call into a plugin.
	ShutdownGrace time.Duration
	// ArenaDir holds the parameter arena ("" for /dev/shm).
	ArenaDir string
	Logger   hclog.Logger
}

// Hooks are the rest of the rank's part in a replacement.
type Hooks struct {
	// Send tells the coordinator (PluginRestarted).
	Send func(context.Context, proto.Message) error
	// Release ends what still uses the lost plugin of kind before it is
	// replaced: a round running beside the training the trainer was lost
	// in.
	Release func(ctx context.Context, kind pluginhost.Kind, cause error) error
	// TrainerReplaced re-arms what a fresh trainer must be told again:
	// the cohort's global step.
	TrainerReplaced func()
}

// Supervisor holds the plugins. The rank's main goroutine uses it, except
// for ConfiguredAverager and AbortRound, which any goroutine may call once
// ConfigureAverager has returned.
type Supervisor struct {
	c     Config
	log   hclog.Logger
	hooks Hooks

	trainer  plugin.Trainer
	averager plugin.Averager
	// avg is the averager once configured, for the other goroutines; nil
	// while a replacement is under way.
	avg atomic.Pointer[plugin.Averager]

	// trainerCfg and avgCfg are what the plugins were configured with, for
	// their replacements; setup and avgTraits are what they answered.
	trainerCfg plugin.TrainerConfig
	avgCfg     plugin.AveragerConfig
	setup      plugin.TrainerSetup
	avgTraits  plugin.AveragerTraits

	arena *sharena.Owned
	// trainerReady: configured and attached to the arena, so it can
	// publish and save.
	trainerReady bool
	// canOverlap: rounds marked Sync.overlap may run while the rank trains
	// (Admit.overlap_rounds, and a trainer that keeps its parameters out
	// of the arena).
	canOverlap bool
	// device is the trainer's parameters on its GPU, handed to the
	// averager in its arena descriptor, when both plugins take device
	// blocks (plugin.CapDeviceBlock; deviceBlocks) and the trainer
	// exported one.
	device       *sharena.DeviceBlock
	deviceBlocks bool

	restarts int
	// lastSave is the checkpoint directory of the last save this rank
	// made (or resumed from): a new plugin restores its state from it.
	lastSave string
}

// New makes the supervisor of c's plugins; nothing starts until Start.
func New(c Config, hooks Hooks) *Supervisor {
	return &Supervisor{c: c, log: c.Logger, hooks: hooks}
}

// Start launches both plugins and asks what they are.
func (s *Supervisor) Start(ctx context.Context) (td, ad plugin.Description, err error) {
	t, err := s.c.Plugins.StartTrainer(ctx, s.c.TrainerName)
	if err != nil {
		return td, ad, fmt.Errorf("start trainer plugin %q: %w", s.c.TrainerName, err)
	}
	s.trainer = t
	a, err := s.c.Plugins.StartAverager(ctx, s.c.AveragerName)
	if err != nil {
		return td, ad, fmt.Errorf("start averager plugin %q: %w", s.c.AveragerName, err)
	}
	s.averager = a
	if td, err = s.trainer.Describe(ctx); err != nil {
		return td, ad, fmt.Errorf("describe trainer plugin %q: %w", s.c.TrainerName, err)
	}
	s.log.Debug("trainer plugin", "name", td.Name, "version", td.Version, "capabilities", td.Capabilities)
	if ad, err = s.averager.Describe(ctx); err != nil {
		return td, ad, fmt.Errorf("describe averager plugin %q: %w", s.c.AveragerName, err)
	}
	s.log.Debug("averager plugin", "name", ad.Name, "version", ad.Version, "capabilities", ad.Capabilities, "meeting", ad.MeetingKind())
	return td, ad, nil
}

// ConfigureTrainer configures the trainer, creates the arena its layout
// asks for (named after prefix), attaches the trainer to it and, when
// deviceBlocks, takes its parameters' GPU block.
func (s *Supervisor) ConfigureTrainer(ctx context.Context, cfg plugin.TrainerConfig, prefix string, deviceBlocks bool) (err error) {
	s.trainerCfg = cfg
	if s.setup, err = s.trainer.Configure(ctx, cfg); err != nil {
		return fmt.Errorf("configure trainer: %w", err)
	}
	if s.arena, err = sharena.Create(s.c.ArenaDir, prefix, s.setup.Layout); err != nil {
		return fmt.Errorf("trainer layout: %w", err)
	}
	zeroCopy, err := s.trainer.Attach(ctx, s.arena.Descriptor())
	if err != nil {
		return fmt.Errorf("attach trainer to arena %s: %w", s.arena.Path(), err)
	}
	s.trainerReady = true
	s.canOverlap = cfg.OverlapRounds && !zeroCopy
	s.deviceBlocks = deviceBlocks
	if err := s.exportDevice(ctx); err != nil {
		return err
	}
	s.log.Debug("arena ready", "path", s.arena.Path(), "bytes", s.setup.Layout.Size, "zero_copy", zeroCopy,
		"rounds_beside_training", s.canOverlap)
	return nil
}

// Resume has the trainer load the checkpoint in from, which later
// replacements restore from too.
func (s *Supervisor) Resume(ctx context.Context, from string) error {
	res, err := s.loadTrainer(ctx, from, plugin.LoadResume)
	if err != nil {
		return fmt.Errorf("resume from %s: %w", from, err)
	}
	s.log.Info("resumed", "from", from, "step_count", res.StepCount)
	s.lastSave = from
	return nil
}

// ConfigureAverager configures the averager, restores its state from the
// checkpoint in from when there is one, and publishes it to the other
// goroutines (ConfiguredAverager).
func (s *Supervisor) ConfigureAverager(ctx context.Context, cfg plugin.AveragerConfig, from string) (err error) {
	s.avgCfg = cfg
	if s.avgTraits, err = s.averager.Configure(ctx, cfg); err != nil {
		return fmt.Errorf("configure averager: %w", err)
	}
	if from != "" {
		if err := s.loadAverager(ctx, from); err != nil {
			return fmt.Errorf("resume averager state from %s: %w", from, err)
		}
	}
	a := s.averager
	s.avg.Store(&a)
	return nil
}

// Reconfigure points the configured averager at a new meeting point, for
// a coordinator that came back: the same averager process, configured
// again (a second Configure replaces the first) with its state carried
// over through a save into scratch, a directory of the rank's own, or,
// when from is set, restored from the checkpoint there instead.
func (s *Supervisor) Reconfigure(ctx context.Context, endpoint, from, scratch string) (err error) {
	if from == "" {
		dir, err := os.MkdirTemp(scratch, "averager-state-")
		if err != nil {
			return fmt.Errorf("reconfigure averager: %w", err)
		}
		defer os.RemoveAll(dir)
		if _, err := s.averager.SaveState(ctx, dir); err != nil {
			return fmt.Errorf("reconfigure averager: keep its state: %w", err)
		}
		defer func() {
			if err == nil {
				err = s.averager.LoadState(ctx, dir)
			}
		}()
	}
	cfg := s.avgCfg
	cfg.Endpoint = endpoint
	s.avgCfg = cfg
	if s.avgTraits, err = s.averager.Configure(ctx, cfg); err != nil {
		return fmt.Errorf("configure averager at %s: %w", endpoint, err)
	}
	if from != "" {
		if err := s.loadAverager(ctx, from); err != nil {
			return fmt.Errorf("reconfigure averager: restore its state from %s: %w", from, err)
		}
	}
	return nil
}

// Trainer is the trainer now: after a replacement, the new one.
func (s *Supervisor) Trainer() plugin.Trainer { return s.trainer }

// Averager is the averager now, for the main goroutine.
func (s *Supervisor) Averager() plugin.Averager { return s.averager }

// ConfiguredAverager is the configured averager, or nil (before
// ConfigureAverager, and while a replacement is under way); any goroutine
// may call it.
func (s *Supervisor) ConfiguredAverager() plugin.Averager {
	if p := s.avg.Load(); p != nil {
		return *p
	}
	return nil
}

// Setup is what the trainer answered its Configure.
func (s *Supervisor) Setup() plugin.TrainerSetup { return s.setup }

// AveragerTraits is what the averager answered its Configure.
func (s *Supervisor) AveragerTraits() plugin.AveragerTraits { return s.avgTraits }

// CanOverlap reports whether a round may run while the rank trains.
func (s *Supervisor) CanOverlap() bool { return s.canOverlap }

// WithTrainer runs call on the trainer, and once more on a fresh one when
// the trainer was lost during it.
func (s *Supervisor) WithTrainer(ctx context.Context, call func(plugin.Trainer) error) error {
	err := call(s.trainer)
	lost, rerr := s.Recover(ctx, pluginhost.Trainer, err, nil)
	if !lost {
		return err
	}
	if rerr != nil {
		return rerr
	}
	return call(s.trainer)
}

// exportDevice asks a trainer that can for its parameters on the GPU, when
// the averager can average them there: from then on the arena's f32
// entries go stale, and the averager gets the block instead.
func (s *Supervisor) exportDevice(ctx context.Context) error {
	s.device = nil
	e, ok := s.trainer.(plugin.DeviceExporter)
	if !s.deviceBlocks || !ok {
		return nil
	}
	b, ok, err := e.ExportDevice(ctx)
	if err != nil {
		return fmt.Errorf("the trainer's parameters on the GPU: %w", err)
	}
	if !ok {
		return nil
	}
	if err := s.setup.Layout.CheckDevice(b); err != nil {
		return fmt.Errorf("the trainer's parameters on the GPU: %w", err)
	}
	s.device = &b
	s.log.Info("parameters stay on the GPU: the averager maps the trainer's block", "gpu", b.GPU, "bytes", b.Size)
	return nil
}

// ArenaDescriptor is the arena the averager is given, with the trainer's
// device block when there is one.
func (s *Supervisor) ArenaDescriptor() sharena.Descriptor {
	d := s.arena.Descriptor()
	d.Device = s.device
	return d
}

// AbortRound aborts the configured averager's round, if there is one to
// abort; inFlight says a round was in flight (only then is the abort news
// worth an info line). An averager that does not answer within
// AbortTimeout is wedged: it is killed, which ends the round's call, and
// the main goroutine's Recover replaces it.
func (s *Supervisor) AbortRound(ctx context.Context, reason string, inFlight bool) {
	avg := s.ConfiguredAverager()
	if avg == nil {
		return
	}
	// Teardown aborts as a matter of course; only an abort that stops a
	// round in flight is news.
	logf := s.log.Debug
	if inFlight {
		logf = s.log.Info
	}
	logf("aborting the averaging round", "reason", reason, "in_flight", inFlight)
	actx, done := context.WithTimeout(ctx, AbortTimeout)
	err := avg.Abort(actx, reason)
	done()
	switch {
	case err != nil && ctx.Err() != nil:
		// The worker is tearing down: an abort it cut short is expected.
		s.log.Debug("averager abort ended by the teardown", "error", err)
	case err != nil:
		s.log.Warn("averager abort failed", "error", err)
	}
	if errors.Is(err, context.DeadlineExceeded) && s.replaceable() {
		s.log.Warn("averager did not answer Abort: killing it", "within", AbortTimeout)
		if err := s.stopPlugin(ctx, pluginhost.Averager); err != nil {
			s.log.Debug("stopping the wedged averager", "error", err)
		}
	}
}

// The teardown's part of the plugins, in its order (see core/worker's
// teardown).

// AbortAverager aborts the averager: a round stuck on a dead peer would
// block the rest of the teardown.
func (s *Supervisor) AbortAverager(ctx context.Context) {
	if s.averager == nil {
		return
	}
	actx, cancel := context.WithTimeout(ctx, min(AbortTimeout, s.c.ShutdownGrace))
	defer cancel()
	if err := s.averager.Abort(actx, "rank shutting down"); err != nil {
		s.log.Debug("averager abort at teardown", "error", err)
	}
}

// PublishFinal leaves the trainer's final parameters in the arena.
func (s *Supervisor) PublishFinal(ctx context.Context) {
	if !s.trainerReady {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, s.c.ShutdownGrace)
	defer cancel()
	if _, err := s.trainer.Publish(pctx); err != nil {
		s.log.Warn("publish final parameters", "error", err)
	}
}

// StopAll stops every plugin, then removes the arena they mapped.
func (s *Supervisor) StopAll(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 2*s.c.ShutdownGrace+5*time.Second)
	if err := s.c.Plugins.StopAll(sctx); err != nil {
		s.log.Warn("stop plugins", "error", err)
	}
	cancel()
	if s.arena != nil {
		if err := s.arena.Remove(); err != nil {
			s.log.Warn("remove arena", "error", err)
		}
	}
}
