package coordinator

import (
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// startTraining runs when round 0 completes: a fresh run starts epoch 0, a
// resumed one rebuilds the epoch in progress from its checkpoint.
func (r *runner) startTraining() {
	m := r.c.meta
	if m == nil {
		r.startEpoch(0)
		return
	}
	r.rep.Resumed(m.Rounds, slices.Clone(m.Finished))
	r.epoch = m.Epoch
	if m.Epoch >= uint64(r.cfg.Run.Epochs) {
		r.log.Info("the checkpoint holds a finished run; shutting down", "epoch", m.Epoch)
		r.disp.Resume(dispatch.Resumed{Epoch: m.Epoch, GlobalStep: m.GlobalStep}, nil) // nothing left
		r.rep.StartEpoch(m.Epoch, record.EpochProgress{})
		r.shutdown()
		return
	}
	same := r.disp.Resume(dispatch.Resumed{Epoch: m.Epoch, Remaining: m.Remaining, Pool: m.Pool, GlobalStep: m.GlobalStep}, r.live())
	r.rep.StartEpoch(m.Epoch, m.Partial)
	r.disp.RestoreController(m.Controller, m.ControllerWindow)
	r.snap = r.progressNow()
	r.log.Info("resumed", "checkpoint", r.c.resume, "epoch", m.Epoch, "samples_left", r.disp.Remaining(),
		"same_partitions", same)
}

// startEpoch splits epoch e over the live ranks.
func (r *runner) startEpoch(e uint64) {
	r.epoch = e
	r.disp.StartEpoch(e, r.live())
	r.rep.StartEpoch(e, record.EpochProgress{})
	r.phase = phTraining
	r.snap = r.progressNow()
	r.log.Info("epoch started", "epoch", e, "samples", r.pickSpace, "ranks", len(r.live()))
}

// endEpoch runs after the epoch's last round: the eval role's election,
// evaluation on its rank when due, then the checkpoint when due, then the
// next epoch.
func (r *runner) endEpoch() {
	r.phase = phEval
	r.disp.EndEpoch()
	r.electRole()
	switch live := r.live(); {
	case !r.evaluates(r.epoch):
		r.log.Debug("no evaluation: coordinator.eval_every skips this epoch", "epoch", r.epoch, "eval_every", r.cfg.Coordinator.EvalEvery)
		r.closeEpoch()
		return
	case len(live) > 0 && r.ranks[live[0]].ready.GetEvalSamples() == 0:
		// The trainers hold no test split (every rank loads the same data):
		// asking would only fail.
		r.log.Debug("no evaluation: the trainer has no test split", "epoch", r.epoch)
		r.closeEpoch()
		return
	}
	r.sendEvaluate()
}

// sendEvaluate asks the eval role's rank to evaluate (again, when the
// previous target was lost and the role moved).
func (r *runner) sendEvaluate() {
	if len(r.live()) == 0 {
		return
	}
	r.evalTarget = int64(r.role)
	r.send(r.ranks[r.role], &wirepb.Evaluate{ScheduleId: r.epoch, Epoch: r.epoch, TargetRank: r.role})
}

func (r *runner) onEvalResult(rs *rankState, m *wirepb.EvalResult) {
	if r.phase != phEval || r.evalTarget != int64(rs.id) || m.GetScheduleId() != r.epoch {
		r.log.Warn("ignoring an unexpected EvalResult", "rank", rs.id, "schedule", m.GetScheduleId())
		return
	}
	r.evalTarget = -1
	if e := m.GetError(); e != "" {
		r.log.Warn("evaluation failed", "rank", rs.id, "epoch", r.epoch, "error", e)
	} else {
		r.rep.Evaluated(m)
	}
	r.closeEpoch()
}

// closeEpoch records the evaluated epoch, then checkpoints or moves on.
func (r *runner) closeEpoch() {
	r.recordEpoch()
	// The trainer's end-of-epoch code runs on the callback rank, after the
	// evaluation and before anything of the next epoch (it is in order
	// there); nothing waits for it.
	if rs := r.ranks[r.role]; rs.status == stLive {
		r.send(rs, &wirepb.EpochEnd{Epoch: r.epoch, TargetRank: r.role})
	}
	if every := r.cfg.Coordinator.CheckpointEvery; every > 0 && (r.epoch+1)%uint64(every) == 0 {
		r.beginCheckpoint()
		return
	}
	r.nextEpoch()
}

// recordEpoch closes the epoch's figures; from here on a save resumes at
// the next epoch.
func (r *runner) recordEpoch() {
	s := r.rep.EndEpoch()
	if s.EvalLoss != nil {
		r.disp.EvalLoss(r.roundSeq, r.epoch+1, *s.EvalLoss)
	}
	r.snap = checkpoint.Progress{Snapshot: r.disp.FreshSnapshot(r.epoch+1, r.live())}
	r.emit(Progress{Kind: ProgressEpoch, Summary: &s})
	r.rep.NoteEpoch(s)
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
	r.broadcast(&wirepb.Shutdown{})
	r.log.Info("training complete; Shutdown sent", "ranks", r.live())
}

// checkExits ends the run once no rank is live and any save is resolved.
func (r *runner) checkExits() bool {
	if len(r.live()) > 0 {
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
