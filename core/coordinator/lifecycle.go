package coordinator

import (
	"fmt"
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

// beginCheckpoint asks every live rank to save into its directory of a
// new checkpoint.
func (r *runner) beginCheckpoint() {
	live := r.live()
	v, tmp, err := r.c.store.begin(live)
	if err != nil {
		r.log.Error("checkpoint skipped", "epoch", r.epoch, "error", err)
		r.nextEpoch()
		return
	}
	r.phase = phCheckpoint
	r.ckpt = &ckptWait{version: v, tmp: tmp, pending: map[uint32]bool{}, progress: r.snap, reason: ReasonCheckpoint}
	for _, id := range live {
		r.ckpt.pending[id] = true
		r.send(r.ranks[id], &wirepb.Checkpoint{Version: v, TargetRank: id, Dir: rankDir(tmp, id)})
	}
}

// beginSave sends ShutdownWithSave to every live rank: each saves into
// its rank-<r> of a new checkpoint and exits. The run ends with status
// once they have.
func (r *runner) beginSave(reason wirepb.ShutdownReason, metaReason, status string, err error) {
	if r.phase == phSaving || r.phase == phShutdown || r.phase == phDone {
		return
	}
	if r.ckpt != nil && !r.ckpt.resolved {
		r.c.store.abandon(r.ckpt.tmp)
		r.ckpt = nil
	}
	r.saveStatus, r.saveErr = status, err
	r.phase = phSaving
	r.exitDeadline = time.Now().Add(r.exitTimeout())
	live := r.live()
	v, tmp, berr := r.c.store.begin(live)
	if berr != nil {
		// Without a directory the ranks can only stop.
		r.log.Error("cannot save; stopping without a checkpoint", "error", berr)
		r.saveErr = fmt.Errorf("coordinator: save: %w", berr)
		r.saveStatus = StatusFailed
		r.phase = phShutdown
		r.broadcast(&wirepb.Shutdown{})
		return
	}
	r.save = &ckptWait{version: v, tmp: tmp, pending: map[uint32]bool{}, progress: r.snap, reason: metaReason}
	msg := &wirepb.ShutdownWithSave{Reason: reason, Dir: tmp, Version: v}
	for _, id := range live {
		r.save.pending[id] = true
		r.send(r.ranks[id], msg)
	}
	r.log.Info("ShutdownWithSave sent", "reason", reason.String(), "version", v, "ranks", live)
}

// shutdown ends a completed run: Shutdown to every live rank, then wait
// for their Exiting.
func (r *runner) shutdown() {
	r.phase = phShutdown
	r.exitDeadline = time.Now().Add(r.exitTimeout())
	r.broadcast(&wirepb.Shutdown{})
	r.log.Info("training complete; Shutdown sent", "ranks", r.live())
}

func (r *runner) onCheckpointResult(rs *rankState, m *wirepb.CheckpointResult) {
	var w *ckptWait
	switch {
	case r.ckpt != nil && r.ckpt.version == m.GetVersion():
		w = r.ckpt
	case r.save != nil && r.save.version == m.GetVersion():
		w = r.save
	}
	if w == nil || !w.pending[rs.id] {
		r.log.Warn("ignoring an unexpected CheckpointResult", "rank", rs.id, "version", m.GetVersion())
		return
	}
	delete(w.pending, rs.id)
	if e := m.GetError(); e != "" {
		r.log.Error("a rank failed to save", "rank", rs.id, "version", w.version, "error", e)
	} else {
		w.saved = append(w.saved, rs.id)
	}
	r.settleCkpt(w)
}

// ckptRankGone stops waiting for a lost rank's save.
func (r *runner) ckptRankGone(w *ckptWait, rank uint32) {
	if w == nil {
		return
	}
	delete(w.pending, rank)
	r.settleCkpt(w)
}

// settleCkpt completes a checkpoint once no save is pending; after an
// epoch checkpoint the run moves on.
func (r *runner) settleCkpt(w *ckptWait) {
	if len(w.pending) > 0 || w.resolved {
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

// resolveCkpt commits w if any rank saved into it, else removes it.
func (r *runner) resolveCkpt(w *ckptWait) {
	w.resolved = true
	if len(w.saved) == 0 {
		r.log.Error("checkpoint abandoned: no rank saved", "version", w.version)
		if err := r.c.store.abandon(w.tmp); err != nil {
			r.log.Error("removing an abandoned checkpoint failed", "error", err)
		}
		return
	}
	sort.Slice(w.saved, func(i, j int) bool { return w.saved[i] < w.saved[j] })
	m := r.meta(w)
	path, err := r.c.store.commit(w.tmp, m)
	if err != nil {
		r.log.Error("checkpoint failed", "version", w.version, "error", err)
		r.c.store.abandon(w.tmp)
		return
	}
	r.lastCkpt = path
	r.log.Info("checkpoint complete", "path", path, "epoch", m.Epoch, "reason", w.reason)
	r.emit(Progress{Kind: ProgressCheckpoint, Checkpoint: path})
}

func (r *runner) meta(w *ckptWait) *Meta {
	p := w.progress
	m := &Meta{
		SchemaVersion: metaSchema,
		Version:       w.version,
		RunID:         r.c.runID,
		Reason:        w.reason,
		Time:          time.Now().UTC(),
		Seed:          r.cfg.Run.Seed,
		WorldSize:     r.world,
		Policy:        string(r.policy),
		Epochs:        r.cfg.Run.Epochs,
		PickSpace:     r.pickSpace,
		BatchSize:     r.batch,
		SavedRanks:    w.saved,
		Epoch:         p.epoch,
		Pool:          p.pool,
		Partial:       p.partial,
		Rounds:        r.roundsBefore + r.rounds,
		GlobalStep:    r.globalStep(),
		Finished:      r.finished,
	}
	ids := make([]uint32, 0, len(p.remaining))
	for id := range p.remaining {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		m.Remaining = append(m.Remaining, RankRanges{Rank: id, Ranges: p.remaining[id]})
	}
	if r.cad != nil {
		m.Cadence = r.cad.state()
	}
	return m
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
