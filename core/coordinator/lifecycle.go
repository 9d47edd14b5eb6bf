package coordinator

import (
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// endEpoch runs after the epoch's last round: evaluation on the
// epoch-callback rank, then the checkpoint when due, then the next epoch.
func (r *runner) endEpoch() {
	r.phase = phEval
	r.work = nil
	if live := r.live(); len(live) > 0 && r.ranks[live[0]].ready.GetEvalSamples() == 0 {
		// The trainers hold no test split (every rank loads the same data):
		// asking would only fail.
		r.log.Debug("no evaluation: the trainer has no test split", "epoch", r.epoch)
		r.closeEpoch()
		return
	}
	r.sendEvaluate()
}

// sendEvaluate asks the epoch-callback rank to evaluate (again, when the
// previous target was lost).
func (r *runner) sendEvaluate() {
	live := r.live()
	if len(live) == 0 {
		return
	}
	if r.ranks[r.role].status != stLive {
		r.role = live[0]
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
		if l := m.GetLoss(); finite(l) {
			r.agg.evalLoss = &l
		}
		if m.Accuracy != nil && finite(m.GetAccuracy()) {
			a := m.GetAccuracy()
			r.agg.accuracy = &a
		}
	}
	r.closeEpoch()
}

// closeEpoch records the evaluated epoch, then checkpoints or moves on.
func (r *runner) closeEpoch() {
	r.recordEpoch()
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
		r.shutdown()
	case r.stopReq:
		r.epoch++
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, ReasonInterrupted, StatusStopped, nil)
	default:
		r.startEpoch(r.epoch + 1)
	}
}

// shutdown ends a completed run: Shutdown to every live rank, then wait
// for their Exiting.
func (r *runner) shutdown() {
	r.phase = phShutdown
	r.exitDeadline = time.Now().Add(r.exitTimeout())
	r.broadcast(&wirepb.Shutdown{})
	r.log.Info("training complete; Shutdown sent", "ranks", r.live())
}
