package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// errRestartBudget wraps the failure of a plugin the rank may not replace
// any more (Config.Restarts spent): the rank dies of it, as a rank
// without the budget always did.
var errRestartBudget = errors.New("plugin restart budget spent")

// Lost reports whether err, from a call into the plugin of kind, means the
// plugin process is gone (it exited, or its connection is): a plugin that
// merely failed the call is not replaced.
func (s *Supervisor) Lost(kind pluginhost.Kind, err error) bool {
	rp, ok := s.c.Plugins.(Replaceable)
	if !ok || err == nil {
		return false
	}
	return rp.Exited(kind) || status.Code(err) == codes.Unavailable
}

// Recover is the one place a lost plugin is handled. When err, from a call
// into the plugin of kind, says the plugin is gone, Recover ends what still
// uses it (Hooks.Release), replaces it with a fresh process and tells the
// coordinator (PluginRestarted; plan is the one the trainer was lost in, if
// any, which the coordinator hands out again): it returns true, and the
// error that ends the rank when the budget is spent or the replacement
// failed. Any other err is the caller's: false, nil.
func (s *Supervisor) Recover(ctx context.Context, kind pluginhost.Kind, err error, plan *plugin.Plan) (bool, error) {
	if !s.Lost(kind, err) {
		return false, nil
	}
	if rerr := s.hooks.Release(ctx, kind, err); rerr != nil {
		return true, rerr
	}
	if kind == pluginhost.Trainer {
		return true, s.replaceTrainer(ctx, err, plan)
	}
	return true, s.replaceAverager(ctx, err)
}

// replacing begins the replacement of the lost plugin of kind: it takes
// one restart from the budget (or returns why the rank must die of cause
// instead), withdraws a lost averager from the other goroutines, and stops
// what is left of the plugin. fail names the replacement in what goes
// wrong with it.
func (s *Supervisor) replacing(ctx context.Context, kind pluginhost.Kind, cause error) (fail func(error) error, err error) {
	if s.restarts >= s.c.Restarts {
		return nil, fmt.Errorf("%s plugin %q lost after %d restarts (worker.plugin_restarts = %d): %w: %w",
			kind, s.pluginName(kind), s.restarts, s.c.Restarts, errRestartBudget, cause)
	}
	s.restarts++
	s.log.Warn("replacing a lost plugin with a fresh process", "kind", kind, "name", s.pluginName(kind),
		"restart", s.restarts, "budget", s.c.Restarts, "cause", cause)
	if kind == pluginhost.Averager {
		s.avg.Store(nil)
	}
	if err := s.stopPlugin(ctx, kind); err != nil {
		s.log.Debug("stopping the lost plugin", "kind", kind, "error", err)
	}
	return func(err error) error { return fmt.Errorf("replace the lost %s (%v): %w", kind, cause, err) }, nil
}

func (s *Supervisor) pluginName(kind pluginhost.Kind) string {
	if kind == pluginhost.Trainer {
		return s.c.TrainerName
	}
	return s.c.AveragerName
}

// replaceable reports whether the plugins run as processes, which can be
// lost, stopped and replaced (in-process plugins cannot).
func (s *Supervisor) replaceable() bool {
	_, ok := s.c.Plugins.(Replaceable)
	return ok
}

// stopPlugin stops what is left of the plugin of kind, when it runs as a
// process: a wedged one gets the grace period for its Shutdown, then is
// killed. Safe from any goroutine: AbortRound kills a wedged averager,
// whose round then fails, and the main goroutine replaces it.
func (s *Supervisor) stopPlugin(ctx context.Context, kind pluginhost.Kind) error {
	rp, ok := s.c.Plugins.(Replaceable)
	if !ok {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.c.ShutdownGrace)
	defer cancel()
	return rp.Stop(sctx, kind)
}

// replaceTrainer starts a fresh trainer in place of the lost one: the same
// configuration, the same arena, whose parameters (the last Publish's, the
// last round's, or a zero-copy trainer's values when it died) it keeps,
// with the optimizer state of the rank's last checkpoint when there is one
// (plugin.LoadReplacement). lost, when set, is the plan the old trainer
// was in: the coordinator hands out again what its reports do not cover.
func (s *Supervisor) replaceTrainer(ctx context.Context, cause error, lost *plugin.Plan) error {
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
	t, err := s.c.Plugins.StartTrainer(ctx, s.c.TrainerName)
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
	s.avgCfg.Arena = s.ArenaDescriptor()
	s.hooks.TrainerReplaced()
	msg := &wirepb.PluginRestarted{Rank: s.c.Rank, Kind: string(pluginhost.Trainer), Reason: cause.Error(), Restarts: uint32(s.restarts)}
	if lost != nil {
		msg.PlanLost, msg.Epoch, msg.PartitionOffset, msg.PartitionSize = true, lost.Epoch, lost.PartitionOffset, lost.PartitionSize
	}
	if err := s.hooks.Send(ctx, msg); err != nil || !blockLost {
		return err
	}
	return s.replaceAverager(ctx, fmt.Errorf("its map of the trainer's parameters on the GPU died with the trainer (%w)", cause))
}

// replaceAverager starts a fresh averager in place of the lost one,
// configured as the first was (arena, endpoint, relay), with the averager
// state of the last checkpoint, and tells the coordinator, which re-forms
// the group: the new averager joins at the next session. It takes the
// steps of replaceTrainer that an averager has, so the two read alike.
func (s *Supervisor) replaceAverager(ctx context.Context, cause error) error {
	fail, err := s.replacing(ctx, pluginhost.Averager, cause)
	if err != nil {
		return err
	}
	a, err := s.c.Plugins.StartAverager(ctx, s.c.AveragerName)
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
	return s.hooks.Send(ctx, &wirepb.PluginRestarted{Rank: s.c.Rank, Kind: string(pluginhost.Averager), Reason: cause.Error(), Restarts: uint32(s.restarts)})
}
