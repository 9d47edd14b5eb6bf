package coordinator

import (
	"fmt"
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// When the run saves: an epoch's checkpoint, a ShutdownWithSave, and the
// trained model's export after the last epoch. How a checkpoint is built
// and what its meta.json holds is package checkpoint's.

// beginCheckpoint asks every live rank to save into its directory of a
// new checkpoint.
func (r *runner) beginCheckpoint() {
	live := r.ranks.Live()
	w, err := r.c.ckpts.Begin(live, r.snap, checkpoint.ReasonCheckpoint)
	if err != nil {
		r.log.Error("checkpoint skipped", "epoch", r.epoch+1, "error", err)
		r.nextEpoch()
		return
	}
	r.phase = phCheckpoint
	r.ckpt = w
	for _, id := range live {
		r.ranks.Send(id, &wirepb.Checkpoint{Version: w.Version(), TargetRank: id, Dir: w.RankDir(id)})
	}
}

// beginSave sends ShutdownWithSave to every live rank: each saves into
// its rank-<r> of a new checkpoint and exits. The run ends with status
// once they have.
func (r *runner) beginSave(reason wirepb.ShutdownReason, metaReason, status string, err error) {
	if r.phase == phSaving || r.phase == phShutdown || r.phase == phDone {
		return
	}
	if r.ckpt != nil && !r.ckpt.Resolved() {
		r.c.ckpts.Abandon(r.ckpt)
		r.ckpt = nil
	}
	r.saveStatus, r.saveErr = status, err
	r.phase = phSaving
	r.exitDeadline = time.Now().Add(r.c.exitTimeout(true))
	live := r.ranks.Live()
	w, berr := r.c.ckpts.Begin(live, r.snap, metaReason)
	if berr != nil {
		// Without a directory the ranks can only stop.
		r.log.Error("cannot save; stopping without a checkpoint", "error", berr)
		r.saveErr = fmt.Errorf("coordinator: save: %w", berr)
		r.saveStatus = record.StatusFailed
		r.phase = phShutdown
		r.ranks.Broadcast(&wirepb.Shutdown{})
		return
	}
	r.save = w
	msg := &wirepb.ShutdownWithSave{Reason: reason, Dir: w.Dir(), Version: w.Version()}
	for _, id := range live {
		r.ranks.Send(id, msg)
	}
	r.log.Info("ShutdownWithSave sent", "reason", reason.String(), "version", w.Version(), "ranks", live)
}

func (r *runner) onCheckpointResult(id uint32, m *wirepb.CheckpointResult) {
	if r.phase == phExport && r.export.Answers(id, m) {
		if dir := r.export.Done(m); dir != "" {
			r.emit(Progress{Kind: ProgressModel, Model: dir})
		}
		r.shutdown()
		return
	}
	var w *checkpoint.Wait
	switch {
	case r.ckpt != nil && r.ckpt.Version() == m.GetVersion():
		w = r.ckpt
	case r.save != nil && r.save.Version() == m.GetVersion():
		w = r.save
	}
	if w == nil || !r.c.ckpts.Result(w, id, m.GetError()) {
		r.log.Warn("ignoring an unexpected CheckpointResult", "rank", id, "version", m.GetVersion())
		return
	}
	r.settleCkpt(w)
}

// settleCkpt completes a checkpoint once no save is pending; after an
// epoch checkpoint the run moves on.
func (r *runner) settleCkpt(w *checkpoint.Wait) {
	if !w.Settled() {
		return
	}
	r.resolveCkpt(w)
	if w == r.ckpt {
		r.ckpt = nil
		if r.phase == phCheckpoint {
			r.nextEpoch()
		}
	}
}

// resolveCkpt commits w if any rank saved into it, else removes it. A
// ShutdownWithSave's ranks saved their models as they stood, which for the
// resumed run's root holds what it trained since the last round.
func (r *runner) resolveCkpt(w *checkpoint.Wait) {
	if root, ok := w.Root(); ok && w == r.save {
		w.Holds(root, r.disp.Held(root))
	}
	path := r.c.ckpts.Resolve(w, r.totals())
	if path != "" {
		r.emit(Progress{Kind: ProgressCheckpoint, Checkpoint: path})
		if w == r.ckpt {
			// A rank that starts fresh in a comeback loads this one.
			r.consensusNow(nil)
		}
	}
}

// exportModel asks one rank to save its trained model into OUT/model
// after the last epoch: the eval role's rank, which evaluated it (the
// summary reports its accuracy), else the lowest live one. The run shuts
// down once it is answered (or the rank is lost).
func (r *runner) exportModel() {
	live := r.ranks.Live()
	if len(live) == 0 {
		r.shutdown()
		return
	}
	target := live[0]
	if slices.Contains(live, r.role.Holder()) {
		target = r.role.Holder()
	}
	dir, ok := r.export.Begin(target)
	if !ok {
		r.shutdown()
		return
	}
	r.phase = phExport
	r.ranks.Send(target, &wirepb.Checkpoint{Version: checkpoint.ExportVersion, TargetRank: target, Dir: dir})
	r.log.Info("exporting the trained model", "rank", target)
}
