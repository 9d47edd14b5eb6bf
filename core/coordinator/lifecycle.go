package coordinator

import (
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/membership"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// startTraining runs when round 0 completes: a fresh run starts epoch 0, a
// resumed one rebuilds the epoch in progress from its checkpoint.
func (r *runner) startTraining() {
	if r.cb != nil && r.cb.state != nil {
		r.c.meta = r.cb.resumed(r.world)
		r.cb.keep(r.c.out, r.roundSeq-1, r.log)
	}
	m := r.c.meta
	if m == nil {
		r.startEpoch(0)
		return
	}
	r.rep.Resumed(m.Rounds, slices.Clone(m.Finished))
	r.epoch = m.Epoch
	if m.Epoch >= uint64(r.cfg.Run.Epochs) {
		r.log.Info("the checkpoint holds a finished run; shutting down", "epochs", m.Epoch)
		r.disp.Resume(dispatch.Resumed{Epoch: m.Epoch, GlobalStep: m.GlobalStep}, nil) // nothing left
		r.rep.StartEpoch(m.Epoch, record.EpochProgress{})
		r.shutdown()
		return
	}
	same := r.disp.Resume(dispatch.Resumed{Epoch: m.Epoch, Remaining: m.Remaining, Pool: m.Pool, GlobalStep: m.GlobalStep}, r.ranks.Live())
	r.rep.StartEpoch(m.Epoch, m.Partial)
	r.disp.RestoreController(m.Controller, m.ControllerWindow)
	r.snap = r.progressNow()
	r.log.Info("resumed", "checkpoint", r.c.resume, "epoch", m.Epoch+1, "samples_left", r.disp.Remaining(),
		"same_partitions", same)
}

// startEpoch splits epoch e over the live ranks.
func (r *runner) startEpoch(e uint64) {
	r.epoch = e
	r.disp.StartEpoch(e, r.ranks.Live())
	r.rep.StartEpoch(e, record.EpochProgress{})
	r.phase = phTraining
	r.snap = r.progressNow()
	r.log.Info("epoch started", "epoch", e+1, "samples", r.pickSpace, "ranks", len(r.ranks.Live()))
}

// endEpoch runs after the epoch's last round: the eval role's election,
// evaluation on its rank when due, then the checkpoint when due, then the
// next epoch.
func (r *runner) endEpoch() {
	r.phase = phEval
	r.disp.EndEpoch()
	r.role.Elect(r.epoch)
	switch live := r.ranks.Live(); {
	case !evaluates(r.cfg, r.epoch):
		r.log.Debug("no evaluation: coordinator.eval_every skips this epoch", "epoch", r.epoch+1, "eval_every", r.cfg.Coordinator.EvalEvery)
		r.closeEpoch()
		return
	case len(live) > 0 && r.ranks.ReadyOf(live[0]).GetEvalSamples() == 0:
		// The trainers hold no test split (every rank loads the same data):
		// asking would only fail.
		r.log.Debug("no evaluation: the trainer has no test split", "epoch", r.epoch+1)
		r.closeEpoch()
		return
	}
	r.role.Evaluate(r.epoch)
}

// evaluates reports whether epoch e (from 0) is evaluated: every
// eval_every-th epoch, and the run's last whenever any is, so a finished
// run reports its final accuracy.
func evaluates(cfg *config.Config, e uint64) bool {
	n := uint64(max(cfg.Coordinator.EvalEvery, 0))
	return n > 0 && ((e+1)%n == 0 || e+1 >= uint64(cfg.Run.Epochs))
}

func (r *runner) onEvalResult(id uint32, m *wirepb.EvalResult) {
	if r.phase != phEval || !r.role.Evaluated(id, m.GetScheduleId(), r.epoch) {
		r.log.Warn("ignoring an unexpected EvalResult", "rank", id, "schedule", m.GetScheduleId())
		return
	}
	if e := m.GetError(); e != "" {
		r.log.Warn("evaluation failed", "rank", id, "epoch", r.epoch+1, "error", e)
	} else {
		r.rep.Evaluated(m)
	}
	r.closeEpoch()
}

// closeEpoch closes the evaluated epoch's figures (from here on a save
// resumes at the next epoch), then checkpoints or moves on.
func (r *runner) closeEpoch() {
	s := r.rep.EndEpoch()
	if s.EvalLoss != nil {
		r.disp.EvalLoss(r.roundSeq, r.epoch+1, *s.EvalLoss)
	}
	r.snap = checkpoint.Progress{Snapshot: r.disp.FreshSnapshot(r.epoch+1, r.ranks.Live())}
	r.consensusNow(nil)
	r.emit(Progress{Kind: ProgressEpoch, Summary: &s})
	r.rep.NoteEpoch(s)
	// The trainer's end-of-epoch code runs on the callback rank, after the
	// evaluation and before anything of the next epoch (it is in order
	// there); nothing waits for it.
	if holder := r.role.Holder(); r.ranks.Status(holder) == membership.Live {
		r.ranks.Send(holder, &wirepb.EpochEnd{Epoch: r.epoch, TargetRank: holder})
	}
	if every := r.cfg.Coordinator.CheckpointEvery; every > 0 && (r.epoch+1)%uint64(every) == 0 {
		r.beginCheckpoint()
		return
	}
	r.nextEpoch()
}

// nextEpoch starts the next epoch, or ends the run after the last, or
// saves when a stop is pending.
func (r *runner) nextEpoch() {
	switch {
	case r.epoch+1 >= uint64(r.cfg.Run.Epochs):
		r.epoch++
		r.exportModel()
	case r.stopReq:
		r.epoch++
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, checkpoint.ReasonInterrupted, record.StatusStopped, nil)
	default:
		r.startEpoch(r.epoch + 1)
	}
}

// shutdown ends a completed run: Shutdown to every live rank, then wait
// for their Exiting.
func (r *runner) shutdown() {
	r.phase = phShutdown
	r.exitDeadline = time.Now().Add(r.c.exitTimeout(false))
	r.ranks.Broadcast(&wirepb.Shutdown{})
	r.log.Info("training complete; Shutdown sent", "ranks", r.ranks.Live())
}

// checkExits ends the run once no rank is live and any save is resolved.
func (r *runner) checkExits() bool {
	if len(r.ranks.Live()) > 0 {
		return false
	}
	if r.save != nil && !r.save.Resolved() {
		r.resolveCkpt(r.save)
	}
	if r.phase == phSaving {
		r.finish(r.saveStatus, r.saveErr)
	} else {
		r.finish(record.StatusCompleted, nil)
	}
	return true
}
