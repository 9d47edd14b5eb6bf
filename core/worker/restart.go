package worker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/internal/dirs"
	"github.com/cohortdl/cohort/shared/plugin"
)

// errRestartBudget wraps the failure of a plugin the rank may not replace
// any more (Options.PluginRestarts spent): the rank dies of it, as a rank
// without the budget always did.
var errRestartBudget = errors.New("plugin restart budget spent")

// restartState is the main loop's record of plugin replacements.
type restartState struct {
	restarts int
	// trainerCfg and avgCfg are what the plugins were configured with, for
	// their replacements.
	trainerCfg plugin.TrainerConfig
	avgCfg     plugin.AveragerConfig
	// lastSave is the checkpoint directory of the last save this rank
	// made (or resumed from): a new trainer restores its optimizer from it.
	lastSave string
}

// pluginLost reports whether err, from a call into the plugin of kind,
// means the plugin process is gone (it exited, or its connection is): a
// plugin that merely failed the call is not replaced.
func (w *worker) pluginLost(kind pluginhost.Kind, err error) bool {
	rp, ok := w.plugins.(Replaceable)
	if !ok || err == nil {
		return false
	}
	return rp.Exited(kind) || status.Code(err) == codes.Unavailable
}

// spendRestart takes one restart from the budget, or returns why the rank
// must die of cause instead.
func (w *worker) spendRestart(kind pluginhost.Kind, cause error) error {
	if w.restarts >= w.o.PluginRestarts {
		return fmt.Errorf("%s plugin %q lost after %d restarts (worker.plugin_restarts = %d): %w: %w",
			kind, w.pluginName(kind), w.restarts, w.o.PluginRestarts, errRestartBudget, cause)
	}
	w.restarts++
	w.log.Warn("replacing a lost plugin with a fresh process", "kind", kind, "name", w.pluginName(kind),
		"restart", w.restarts, "budget", w.o.PluginRestarts, "cause", cause)
	return nil
}

func (w *worker) pluginName(kind pluginhost.Kind) string {
	if kind == pluginhost.Trainer {
		return w.o.Trainer.Name
	}
	return w.o.Averager.Name
}

// stopLost stops what is left of the lost plugin of kind (a wedged one
// gets the grace period for its Shutdown, then is killed).
func (w *worker) stopLost(ctx context.Context, kind pluginhost.Kind) {
	sctx, cancel := context.WithTimeout(ctx, w.o.ShutdownGrace)
	defer cancel()
	if err := w.plugins.(Replaceable).Stop(sctx, kind); err != nil {
		w.log.Debug("stopping the lost plugin", "kind", kind, "error", err)
	}
}

// onTrainer runs call on the trainer, and once more on a fresh one when
// the trainer was lost during it.
func (w *worker) onTrainer(ctx context.Context, call func(plugin.Trainer) error) error {
	err := call(w.trainer)
	if err == nil || !w.pluginLost(pluginhost.Trainer, err) {
		return err
	}
	if err := w.replaceTrainer(ctx, err, nil); err != nil {
		return err
	}
	return call(w.trainer)
}

// replaceTrainer starts a fresh trainer in place of the lost one: the same
// configuration, the same arena, whose parameters (the last Publish's, or
// the last round's) it adopts, and the optimizer state of the rank's last
// checkpoint when there is one. lost, when set, is the plan the old trainer
// was in: the coordinator hands out again what its reports do not cover.
func (w *worker) replaceTrainer(ctx context.Context, cause error, lost *plugin.Plan) error {
	if err := w.spendRestart(pluginhost.Trainer, cause); err != nil {
		return err
	}
	w.stopLost(ctx, pluginhost.Trainer)
	fail := func(err error) error { return fmt.Errorf("replace the lost trainer (%v): %w", cause, err) }
	t, err := w.plugins.StartTrainer(ctx, w.o.Trainer.Name)
	if err != nil {
		return fail(err)
	}
	w.trainer = t
	setup, err := t.Configure(ctx, w.trainerCfg)
	if err != nil {
		return fail(fmt.Errorf("configure: %w", err))
	}
	if setup.Layout.Digest() != w.setup.Layout.Digest() {
		return fail(errors.New("the new trainer's parameter layout differs from the arena's"))
	}
	zeroCopy, err := t.Attach(ctx, w.arena.Descriptor())
	if err != nil {
		return fail(fmt.Errorf("attach to arena %s: %w", w.arena.Path(), err))
	}
	w.canOverlap = w.trainerCfg.OverlapRounds && !zeroCopy
	if dir := w.checkpointToRestore(); dir != "" {
		steps, err := t.LoadCheckpoint(ctx, dir)
		if err != nil {
			return fail(fmt.Errorf("restore from %s: %w", dir, err))
		}
		w.log.Info("new trainer restored its optimizer state from the last checkpoint", "dir", dir, "step_count", steps)
	} else {
		w.log.Warn("new trainer starts its optimizer fresh: this rank has no checkpoint to restore it from")
	}
	// The arena holds the parameters of the last Publish or round, newer
	// than any checkpoint's; unless they lived on the GPU, in the lost
	// trainer's block, which died with it: then the new trainer keeps the
	// checkpoint's, the next round averages them in, and the averager,
	// whose mapping of the block died too, is replaced after this.
	blockLost := w.device != nil
	if !blockLost {
		if _, err := t.Adopt(ctx, 0); err != nil {
			return fail(fmt.Errorf("adopt the arena's parameters: %w", err))
		}
	}
	if err := w.exportDevice(ctx, t); err != nil {
		return fail(err)
	}
	w.avgCfg.Arena = w.arenaDescriptor()
	// The next plan passes the cohort's step count again, to the new
	// trainer's learning-rate schedule.
	w.stepFresh = true
	msg := &wirepb.PluginRestarted{Rank: w.o.Rank, Kind: string(pluginhost.Trainer), Reason: cause.Error(), Restarts: uint32(w.restarts)}
	if lost != nil {
		msg.PlanLost, msg.Epoch, msg.PartitionOffset, msg.PartitionSize = true, lost.Epoch, lost.PartitionOffset, lost.PartitionSize
	}
	if err := w.send(ctx, msg); err != nil || !blockLost {
		return err
	}
	return w.replaceAverager(ctx, fmt.Errorf("its map of the trainer's parameters on the GPU died with the trainer (%w)", cause))
}

// replaceAverager starts a fresh averager in place of the lost one,
// configured as the first was (arena, endpoint, relay), with the averager
// state of the last checkpoint, and tells the coordinator, which re-forms
// the group: the new averager joins at the next session.
func (w *worker) replaceAverager(ctx context.Context, cause error) error {
	if err := w.spendRestart(pluginhost.Averager, cause); err != nil {
		return err
	}
	w.avg.Store(nil)
	w.stopLost(ctx, pluginhost.Averager)
	fail := func(err error) error { return fmt.Errorf("replace the lost averager (%v): %w", cause, err) }
	a, err := w.plugins.StartAverager(ctx, w.o.Averager.Name)
	if err != nil {
		return fail(err)
	}
	w.averager = a
	if w.avgTraits, err = a.Configure(ctx, w.avgCfg); err != nil {
		return fail(fmt.Errorf("configure: %w", err))
	}
	if dir := w.checkpointToRestore(); dir != "" {
		if err := a.LoadState(ctx, dir); err != nil {
			return fail(fmt.Errorf("restore state from %s: %w", dir, err))
		}
	}
	w.avg.Store(&a)
	return w.send(ctx, &wirepb.PluginRestarted{Rank: w.o.Rank, Kind: string(pluginhost.Averager), Reason: cause.Error(), Restarts: uint32(w.restarts)})
}

// checkpointToRestore is the directory of the rank's last save, if it
// still holds files. The coordinator saves into a temporary directory and
// renames it into place once complete (docs/protocol.md, "Checkpoints and
// stopping"), so a save under .tmp-<name> is looked for under <name>.
func (w *worker) checkpointToRestore() string {
	dir := w.lastSave
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
