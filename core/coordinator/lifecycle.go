package coordinator

import (
	"sort"
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

// recordEpoch closes the epoch's figures; from here on a save resumes at
// the next epoch.
func (r *runner) recordEpoch() {
	a := r.agg
	s := EpochSummary{
		Epoch:    r.epoch,
		EvalLoss: a.evalLoss,
		Accuracy: a.accuracy,
		Seconds:  a.prior.Seconds + time.Since(a.started).Seconds(),
		Samples:  a.prior.Samples + a.samples,
		Windows:  a.windows,
		Rounds:   a.rounds,
	}
	if b := a.prior.LossBatches + a.lossBatches; b > 0 {
		s.Loss = safe((a.prior.LossSum + a.lossSum) / float64(b))
	}
	if a.rounds > 0 {
		s.MeanRoundMS = safe(a.roundMS / float64(a.rounds))
	}
	if a.waitN > 0 {
		s.WaitAtSyncMS = safe(a.waitSum / float64(a.waitN))
	}
	ids := make([]uint32, 0, len(a.perRank))
	for id := range a.perRank {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		ra := a.perRank[id]
		er := EpochRank{Rank: id, Batches: ra.batches, Samples: ra.samples, Windows: ra.windows, TrainMS: safe(ra.trainMS)}
		if ra.windows > 0 {
			er.BatchesPerWindow = float64(ra.batches) / float64(ra.windows)
		}
		if ra.waitN > 0 {
			er.WaitAtSyncMS = safe(ra.waitSum / float64(ra.waitN))
		}
		s.Ranks = append(s.Ranks, er)
	}
	r.finished = append(r.finished, s)
	r.snap = r.freshProgress(r.epoch + 1)
	r.log.Info("epoch finished", "epoch", r.epoch, "loss", s.Loss, "seconds", s.Seconds,
		"samples", s.Samples, "rounds", s.Rounds, "wait_at_sync_ms", s.WaitAtSyncMS)
	r.emit(Progress{Kind: ProgressEpoch, Summary: &s})
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

// summary builds the run's Summary.
func (r *runner) summary() *Summary {
	s := &Summary{
		Status:           r.status,
		RunID:            r.c.runID,
		WorldSize:        int(r.world),
		Policy:           string(r.policy),
		Trainer:          r.cfg.Trainer.Name,
		Averager:         r.cfg.Averager.Name,
		ResumedFrom:      r.c.resume,
		Started:          r.started.UTC(),
		Seconds:          time.Since(r.started).Seconds(),
		GlobalStep:       r.globalStep(),
		Epochs:           r.finished,
		MembershipEvents: r.memberEvents,
		Checkpoint:       r.lastCkpt,
		Averaging: AveragingSummary{
			Backend:     r.cfg.Averager.Name,
			Rounds:      r.rounds,
			RoundsTotal: r.roundsBefore + r.rounds,
		},
	}
	if r.err != nil {
		s.Error = r.err.Error()
	}
	if s.Epochs == nil {
		s.Epochs = []EpochSummary{}
	}
	if s.MembershipEvents == nil {
		s.MembershipEvents = []MembershipEvent{}
	}
	if r.rounds > 0 {
		s.Averaging.MeanRoundMS = safe(r.roundMS / float64(r.rounds))
		s.Averaging.BytesPerRound = safe(r.bytes / float64(r.rounds))
	}
	for _, rs := range r.ranks {
		state := RankExited
		if rs.status != stExited {
			// Anything but a clean exit is a loss, including a rank that
			// never joined.
			state = RankDead
		}
		reason := rs.reason
		if state == RankDead && reason == "" {
			if rs.status == stAbsent || rs.status == stJoined || rs.status == stReady {
				reason = "never joined the cohort"
			} else {
				reason = "still connected when the run ended"
			}
		}
		s.Ranks = append(s.Ranks, RankSummary{Rank: rs.id, State: state, Samples: rs.samples, Batches: rs.batches, Reason: reason})
	}
	return s
}

// safe keeps a figure JSON can encode.
func safe(x float64) float64 {
	if !finite(x) {
		return 0
	}
	return x
}
