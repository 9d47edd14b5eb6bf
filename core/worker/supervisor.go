package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/internal/dirs"
	sharena "github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// supervisor owns the rank's two plugins: their handles, what they were
// configured with, the arena they share, the checkpoints they save and
// load, and the budget for replacing them. recover is the one place a
// lost plugin is handled: it is replaced within the budget and the
// coordinator told, or the rank dies of it. A checkpoint goes through save,
// loadTrainer and loadAverager alone, so what a plugin is told when it
// loads one, or which folder each plugin saves into, changes there.
//
// The main loop's goroutine uses it, except for averagerRef (the
// bridge's too), replaceable and stopPlugin (the watchdog's) and plugins
// (the sampler's), which start sets before the watchdog and the sampler
// begin.
type supervisor struct {
	o   Options
	log hclog.Logger

	plugins  Plugins
	trainer  plugin.Trainer
	averager plugin.Averager
	// avg is the averager once configured, for the bridge and the
	// watchdog; nil while a replacement is under way.
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

	hooks rankHooks
}

// rankHooks are the rest of the rank's part in a replacement.
type rankHooks struct {
	// send tells the coordinator (PluginRestarted).
	send func(context.Context, proto.Message) error
	// release ends what still uses a lost plugin before it is replaced: a
	// round running beside the training the trainer was lost in.
	release func(ctx context.Context, cause error) error
	// trainerReplaced re-arms what a fresh trainer must be told again:
	// the cohort's global step.
	trainerReplaced func()
}

// errRestartBudget wraps the failure of a plugin the rank may not replace
// any more (Options.PluginRestarts spent): the rank dies of it, as a rank
// without the budget always did.
var errRestartBudget = errors.New("plugin restart budget spent")

func newSupervisor(o Options, log hclog.Logger, hooks rankHooks) *supervisor {
	return &supervisor{o: o, log: log, hooks: hooks}
}

// start launches both plugins and asks what they are.
func (s *supervisor) start(ctx context.Context) (td, ad plugin.Description, err error) {
	if s.o.Plugins != nil {
		s.plugins = s.o.Plugins
	} else {
		s.plugins = NewHostPlugins(pluginhost.Options{
			Dirs:     s.o.PluginDirs,
			Logger:   s.o.Logger.ResetNamed(fmt.Sprintf("rank %d", s.o.Rank)),
			Grace:    s.o.ShutdownGrace,
			Withhold: s.o.Withhold,
			Lock:     s.o.PluginLock,
			Versions: map[pluginhost.Kind]string{
				pluginhost.Trainer:  s.o.Trainer.Version,
				pluginhost.Averager: s.o.Averager.Version,
			},
		})
	}
	t, err := s.plugins.StartTrainer(ctx, s.o.Trainer.Name)
	if err != nil {
		return td, ad, fmt.Errorf("start trainer plugin %q: %w", s.o.Trainer.Name, err)
	}
	s.trainer = t
	a, err := s.plugins.StartAverager(ctx, s.o.Averager.Name)
	if err != nil {
		return td, ad, fmt.Errorf("start averager plugin %q: %w", s.o.Averager.Name, err)
	}
	s.averager = a
	if td, err = s.trainer.Describe(ctx); err != nil {
		return td, ad, fmt.Errorf("describe trainer plugin %q: %w", s.o.Trainer.Name, err)
	}
	s.log.Debug("trainer plugin", "name", td.Name, "version", td.Version, "capabilities", td.Capabilities)
	if ad, err = s.averager.Describe(ctx); err != nil {
		return td, ad, fmt.Errorf("describe averager plugin %q: %w", s.o.Averager.Name, err)
	}
	s.log.Debug("averager plugin", "name", ad.Name, "version", ad.Version, "capabilities", ad.Capabilities, "meeting", ad.MeetingKind())
	return td, ad, nil
}

// configureTrainer configures the trainer, creates the arena its layout
// asks for (named after prefix), attaches the trainer to it and, when
// deviceBlocks, takes its parameters' GPU block.
func (s *supervisor) configureTrainer(ctx context.Context, cfg plugin.TrainerConfig, prefix string, deviceBlocks bool) (err error) {
	s.trainerCfg = cfg
	if s.setup, err = s.trainer.Configure(ctx, cfg); err != nil {
		return fmt.Errorf("configure trainer: %w", err)
	}
	if s.arena, err = sharena.Create(s.o.ArenaDir, prefix, s.setup.Layout); err != nil {
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

// resume has the trainer load the checkpoint in from, which later
// replacements restore from too.
func (s *supervisor) resume(ctx context.Context, from string) error {
	res, err := s.loadTrainer(ctx, from, plugin.LoadResume)
	if err != nil {
		return fmt.Errorf("resume from %s: %w", from, err)
	}
	s.log.Info("resumed", "from", from, "step_count", res.StepCount)
	s.lastSave = from
	return nil
}

// configureAverager configures the averager, restores its state from the
// checkpoint in from when there is one, and publishes it to the bridge
// and the watchdog.
func (s *supervisor) configureAverager(ctx context.Context, cfg plugin.AveragerConfig, from string) (err error) {
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

// loadTrainer has the trainer load the checkpoint in dir for reason: the
// one place it does, at resume and when a fresh trainer replaces a lost
// one.
func (s *supervisor) loadTrainer(ctx context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	return s.trainer.LoadCheckpoint(ctx, pluginDir(dir, trainerDir), reason)
}

// loadAverager has the averager load its state from the checkpoint in
// dir: the one place it does, at resume and when replaced.
func (s *supervisor) loadAverager(ctx context.Context, dir string) error {
	return s.averager.LoadState(ctx, pluginDir(dir, averagerDir))
}

// save writes the trainer's checkpoint and the averager's state into
// their folders in dir: the one place a checkpoint is saved. A trainer
// lost during it is replaced and asked again.
func (s *supervisor) save(ctx context.Context, dir string) ([]string, error) {
	if dir == "" {
		return nil, errors.New("save checkpoint: no directory given")
	}
	if !s.trainerReady {
		return nil, errors.New("save checkpoint: the trainer is not set up")
	}
	tdir, adir := filepath.Join(dir, trainerDir), filepath.Join(dir, averagerDir)
	for _, d := range []string{tdir, adir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("save checkpoint: %w", err)
		}
	}
	var files []string
	err := s.withTrainer(ctx, func(t plugin.Trainer) (err error) {
		files, err = t.SaveCheckpoint(ctx, tdir)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("save checkpoint into %s: %w", tdir, err)
	}
	// The averager's own state (an outer optimizer's momentum) belongs to
	// the same checkpoint, or a resumed run would not continue the same way.
	if a := s.avg.Load(); a != nil {
		more, err := (*a).SaveState(ctx, adir)
		if err != nil {
			return nil, fmt.Errorf("save averager state into %s: %w", adir, err)
		}
		files = append(files, more...)
	}
	s.lastSave = dir
	return files, nil
}

// averagerRef is the configured averager, or nil.
func (s *supervisor) averagerRef() plugin.Averager {
	if p := s.avg.Load(); p != nil {
		return *p
	}
	return nil
}

// withTrainer runs call on the trainer, and once more on a fresh one when
// the trainer was lost during it.
func (s *supervisor) withTrainer(ctx context.Context, call func(plugin.Trainer) error) error {
	err := call(s.trainer)
	lost, rerr := s.recover(ctx, pluginhost.Trainer, err, nil)
	if !lost {
		return err
	}
	if rerr != nil {
		return rerr
	}
	return call(s.trainer)
}

// lost reports whether err, from a call into the plugin of kind, means the
// plugin process is gone (it exited, or its connection is): a plugin that
// merely failed the call is not replaced.
func (s *supervisor) lost(kind pluginhost.Kind, err error) bool {
	rp, ok := s.plugins.(Replaceable)
	if !ok || err == nil {
		return false
	}
	return rp.Exited(kind) || status.Code(err) == codes.Unavailable
}

// recover is the one place a lost plugin is handled. When err, from a call
// into the plugin of kind, says the plugin is gone, recover ends what still
// uses it, replaces it with a fresh process and tells the coordinator
// (PluginRestarted; plan is the one the trainer was lost in, if any, which
// the coordinator hands out again): it returns true, and the error that
// ends the rank when the budget is spent or the replacement failed. Any
// other err is the caller's: false, nil.
func (s *supervisor) recover(ctx context.Context, kind pluginhost.Kind, err error, plan *plugin.Plan) (bool, error) {
	if !s.lost(kind, err) {
		return false, nil
	}
	if rerr := s.hooks.release(ctx, err); rerr != nil {
		return true, rerr
	}
	if kind == pluginhost.Trainer {
		return true, s.replaceTrainer(ctx, err, plan)
	}
	return true, s.replaceAverager(ctx, err)
}

// replacing begins the replacement of the lost plugin of kind: it takes
// one restart from the budget (or returns why the rank must die of cause
// instead), withdraws a lost averager from the bridge and the watchdog,
// and stops what is left of the plugin. fail names the replacement in what
// goes wrong with it.
func (s *supervisor) replacing(ctx context.Context, kind pluginhost.Kind, cause error) (fail func(error) error, err error) {
	if s.restarts >= s.o.PluginRestarts {
		return nil, fmt.Errorf("%s plugin %q lost after %d restarts (worker.plugin_restarts = %d): %w: %w",
			kind, s.pluginName(kind), s.restarts, s.o.PluginRestarts, errRestartBudget, cause)
	}
	s.restarts++
	s.log.Warn("replacing a lost plugin with a fresh process", "kind", kind, "name", s.pluginName(kind),
		"restart", s.restarts, "budget", s.o.PluginRestarts, "cause", cause)
	if kind == pluginhost.Averager {
		s.avg.Store(nil)
	}
	if err := s.stopPlugin(ctx, kind); err != nil {
		s.log.Debug("stopping the lost plugin", "kind", kind, "error", err)
	}
	return func(err error) error { return fmt.Errorf("replace the lost %s (%v): %w", kind, cause, err) }, nil
}

func (s *supervisor) pluginName(kind pluginhost.Kind) string {
	if kind == pluginhost.Trainer {
		return s.o.Trainer.Name
	}
	return s.o.Averager.Name
}

// replaceable reports whether the plugins run as processes, which can be
// lost, stopped and replaced (in-process plugins cannot).
func (s *supervisor) replaceable() bool {
	_, ok := s.plugins.(Replaceable)
	return ok
}

// stopPlugin stops what is left of the plugin of kind, when it runs as a
// process: a wedged one gets the grace period for its Shutdown, then is
// killed. Safe from any goroutine: the watchdog kills a wedged averager,
// whose round then fails, and the main loop replaces it.
func (s *supervisor) stopPlugin(ctx context.Context, kind pluginhost.Kind) error {
	rp, ok := s.plugins.(Replaceable)
	if !ok {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.o.ShutdownGrace)
	defer cancel()
	return rp.Stop(sctx, kind)
}

// replaceTrainer starts a fresh trainer in place of the lost one: the same
// configuration, the same arena, whose parameters (the last Publish's, the
// last round's, or a zero-copy trainer's values when it died) it keeps,
// with the optimizer state of the rank's last checkpoint when there is one
// (plugin.LoadReplacement). lost, when set, is the plan the old trainer
// was in: the coordinator hands out again what its reports do not cover.
func (s *supervisor) replaceTrainer(ctx context.Context, cause error, lost *plugin.Plan) error {
	fail, err := s.replacing(ctx, pluginhost.Trainer, cause)
	if err != nil {
		return err
	}
	// The arena holds the rank's newest parameters, newer than any
	// checkpoint's; unless they lived on the GPU, in the lost trainer's
	// block, which died with it: then the new trainer resumes from the
	// checkpoint, the next round averages it in, and the averager, whose
	// mapping of the block died too, is replaced after this.
	blockLost := s.device != nil
	var newer []byte
	if !blockLost {
		newer = bytes.Clone(s.arena.Bytes())
	}
	t, err := s.plugins.StartTrainer(ctx, s.o.Trainer.Name)
	if err != nil {
		return fail(err)
	}
	s.trainer = t
	setup, err := t.Configure(ctx, s.trainerCfg)
	if err != nil {
		return fail(fmt.Errorf("configure: %w", err))
	}
	if setup.Layout.Digest() != s.setup.Layout.Digest() {
		return fail(errors.New("the new trainer's parameter layout differs from the arena's"))
	}
	zeroCopy, err := t.Attach(ctx, s.arena.Descriptor())
	if err != nil {
		return fail(fmt.Errorf("attach to arena %s: %w", s.arena.Path(), err))
	}
	s.canOverlap = s.trainerCfg.OverlapRounds && !zeroCopy
	// A zero-copy trainer's Attach writes its fresh model into the arena.
	copy(s.arena.Bytes(), newer)
	if err := s.takeParameters(ctx, newer, blockLost); err != nil {
		return fail(err)
	}
	if err := s.exportDevice(ctx); err != nil {
		return fail(err)
	}
	s.avgCfg.Arena = s.arenaDescriptor()
	s.hooks.trainerReplaced()
	msg := &wirepb.PluginRestarted{Rank: s.o.Rank, Kind: string(pluginhost.Trainer), Reason: cause.Error(), Restarts: uint32(s.restarts)}
	if lost != nil {
		msg.PlanLost, msg.Epoch, msg.PartitionOffset, msg.PartitionSize = true, lost.Epoch, lost.PartitionOffset, lost.PartitionSize
	}
	if err := s.hooks.send(ctx, msg); err != nil || !blockLost {
		return err
	}
	return s.replaceAverager(ctx, fmt.Errorf("its map of the trainer's parameters on the GPU died with the trainer (%w)", cause))
}

// replaceAverager starts a fresh averager in place of the lost one,
// configured as the first was (arena, endpoint, relay), with the averager
// state of the last checkpoint, and tells the coordinator, which re-forms
// the group: the new averager joins at the next session. It takes the
// steps of replaceTrainer that an averager has, so the two read alike.
func (s *supervisor) replaceAverager(ctx context.Context, cause error) error {
	fail, err := s.replacing(ctx, pluginhost.Averager, cause)
	if err != nil {
		return err
	}
	a, err := s.plugins.StartAverager(ctx, s.o.Averager.Name)
	if err != nil {
		return fail(err)
	}
	s.averager = a
	if s.avgTraits, err = a.Configure(ctx, s.avgCfg); err != nil {
		return fail(fmt.Errorf("configure: %w", err))
	}
	if dir := s.checkpointToRestore(); dir != "" {
		if err := s.loadAverager(ctx, dir); err != nil {
			return fail(fmt.Errorf("restore state from %s: %w", dir, err))
		}
	}
	s.avg.Store(&a)
	return s.hooks.send(ctx, &wirepb.PluginRestarted{Rank: s.o.Rank, Kind: string(pluginhost.Averager), Reason: cause.Error(), Restarts: uint32(s.restarts)})
}

// checkpointToRestore is the directory of the rank's last save, if it
// still holds files. The coordinator saves into a temporary directory and
// renames it into place once complete (docs/protocol.md, "Checkpoints and
// stopping"), so a save under .tmp-<name> is looked for under <name>.
func (s *supervisor) checkpointToRestore() string {
	dir := s.lastSave
	if dir == "" {
		return ""
	}
	parent := filepath.Dir(dir)
	if name, ok := strings.CutPrefix(filepath.Base(parent), ".tmp-"); ok {
		committed := filepath.Join(filepath.Dir(parent), name, filepath.Base(dir))
		if dirs.NonEmpty(committed) {
			return committed
		}
	}
	if dirs.NonEmpty(dir) {
		return dir
	}
	return ""
}

// exportDevice asks a trainer that can for its parameters on the GPU, when
// the averager can average them there: from then on the arena's f32
// entries go stale, and the averager gets the block instead.
func (s *supervisor) exportDevice(ctx context.Context) error {
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

// arenaDescriptor is the arena the averager is given, with the trainer's
// device block when there is one.
func (s *supervisor) arenaDescriptor() sharena.Descriptor {
	d := s.arena.Descriptor()
	d.Device = s.device
	return d
}

// The teardown's part of the plugins, in its order (see worker.teardown).

// abortAverager aborts the averager: a round stuck on a dead peer would
// block the rest of the teardown.
func (s *supervisor) abortAverager(ctx context.Context) {
	if s.averager == nil {
		return
	}
	actx, cancel := context.WithTimeout(ctx, min(abortTimeout, s.o.ShutdownGrace))
	defer cancel()
	if err := s.averager.Abort(actx, "rank shutting down"); err != nil {
		s.log.Debug("averager abort at teardown", "error", err)
	}
}

// publishFinal leaves the trainer's final parameters in the arena.
func (s *supervisor) publishFinal(ctx context.Context) {
	if !s.trainerReady {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, s.o.ShutdownGrace)
	defer cancel()
	if _, err := s.trainer.Publish(pctx); err != nil {
		s.log.Warn("publish final parameters", "error", err)
	}
}

// stopAll stops every plugin, then removes the arena they mapped.
func (s *supervisor) stopAll(ctx context.Context) {
	if s.plugins != nil {
		sctx, cancel := context.WithTimeout(ctx, 2*s.o.ShutdownGrace+5*time.Second)
		if err := s.plugins.StopAll(sctx); err != nil {
			s.log.Warn("stop plugins", "error", err)
		}
		cancel()
	}
	if s.arena != nil {
		if err := s.arena.Remove(); err != nil {
			s.log.Warn("remove arena", "error", err)
		}
	}
}
