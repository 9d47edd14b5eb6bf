package coordinator

import (
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// stepTraining makes one move of the training phase.
func (r *runner) stepTraining() bool {
	if r.round == nil && r.reissue == nil && r.disp.Training() && r.solo() {
		return r.stepSolo()
	}
	if !r.disp.Windowed() && r.disp.Training() && !r.stopReq && (r.round == nil || r.round.overlap) {
		// Async: idle ranks get their next chunk at once, and one more
		// queued behind it, so a rank whose round runs beside its training
		// never runs dry (during a round that blocks training they get it
		// with the round's Update).
		if plans := r.disp.NextPlans(r.live()); len(plans) > 0 {
			r.deliver(r.live(), plans, nil)
			return true
		}
	}
	if r.round != nil {
		return false
	}
	if r.reissue != nil {
		return r.stepReissue()
	}
	if !r.disp.Training() {
		return false // round 0 has not completed yet
	}
	busy := r.disp.Busy(r.live())
	if r.disp.Windowed() {
		if busy {
			return false
		}
		r.closeWindow()
		if r.disp.Unsynced(r.live()) > 0 {
			if r.session != nil {
				return false
			}
			r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
			return true
		}
		if r.stopReq {
			r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, checkpoint.ReasonInterrupted, record.StatusStopped, nil)
			return true
		}
		if r.disp.Remaining() > 0 {
			r.deliver(r.live(), r.disp.NextPlans(r.live()), nil)
			return true
		}
		r.endEpoch()
		return true
	}

	// Async.
	if busy && r.session == nil && r.disp.AsyncRoundDue(r.live()) {
		r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
		return true
	}
	if busy || (!r.stopReq && r.disp.Remaining() > 0) {
		return false
	}
	if r.disp.Unsynced(r.live()) > 0 {
		if r.session != nil {
			return false
		}
		r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
		return true
	}
	if r.stopReq {
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, checkpoint.ReasonInterrupted, record.StatusStopped, nil)
		return true
	}
	r.endEpoch()
	return true
}

// solo reports whether the cohort is down to one rank whose averager said
// a round alone leaves its arena as it is (Ready.solo_identity): rounds
// would change nothing, so there are none.
func (r *runner) solo() bool {
	live := r.live()
	return len(live) == 1 && r.session == nil && r.ranks[live[0]].ready.GetSoloIdentity()
}

// stepSolo moves a solo cohort: no rounds, and plans of at least
// sync_every batches (about soloPlanTime of the rank's measured batch time)
// with the next one always queued behind the one the rank trains, so it
// never waits on the coordinator between plans, and whose Batch reports
// merge every soloReportMS. Where a round would close
// the work (the rank idle with batches since the last one) the checkpoint
// snapshot and the global step are brought up to date as a round would.
func (r *runner) stepSolo() bool {
	id := r.live()[0]
	if !r.stopReq && r.disp.Outstanding(id) < 2 {
		if p := r.disp.SoloPlan(id); p != nil {
			r.deliver([]uint32{id}, map[uint32]*dispatch.Plan{id: p}, nil)
			return true
		}
	}
	if r.disp.Outstanding(id) > 0 {
		return false
	}
	r.closeWindow() // one opened before the cohort was down to this rank
	if r.disp.Unsynced([]uint32{id}) > 0 {
		r.disp.Settle(id)
		r.snap = r.progressNow()
		r.broadcast(&wirepb.SetGlobalStep{GlobalStep: r.disp.GlobalStep()})
	}
	if r.stopReq {
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, checkpoint.ReasonInterrupted, record.StatusStopped, nil)
		return true
	}
	r.endEpoch()
	return true
}

// deliver sends plans: with version, an Update to every live rank (with
// its plan, if any); without, a StartEpoch to each rank that has one.
func (r *runner) deliver(live []uint32, plans map[uint32]*dispatch.Plan, version *uint64) {
	for _, id := range live {
		rs := r.ranks[id]
		p := plans[id]
		if p != nil {
			r.rep.Handed(id)
		}
		switch {
		case version != nil:
			u := &wirepb.Update{Version: *version}
			if p != nil {
				u.NextPlan = r.disp.EpochPlan(p)
			}
			r.send(rs, u)
		case p != nil:
			r.send(rs, &wirepb.StartEpoch{Plan: r.disp.EpochPlan(p)})
		}
	}
}

// closeWindow records how long each rank of the window waited between its
// last Metrics and the window's close (the Sync that follows at once).
func (r *runner) closeWindow() {
	if waits, ok := r.disp.CloseWindow(); ok {
		r.rep.WindowClosed(waits)
	}
}

// onBatch attributes a trained batch to the rank's first plan it can
// belong to; the counts say where a dead rank stopped.
func (r *runner) onBatch(rs *rankState, m *wirepb.Batch) {
	if rs.status != stLive || !r.disp.Training() {
		return
	}
	b := r.disp.Batch(rs.id, m, r.live(), r.round != nil)
	if b.Throttle {
		r.send(rs, &wirepb.Throttle{})
	}
	if done, loss, due := r.rep.Batch(rs.id, m, b.Batches, b.BatchMS); due {
		r.emit(Progress{Kind: ProgressSamples, Done: done, Loss: loss})
	}
}

// onMetrics closes the plan it names.
func (r *runner) onMetrics(rs *rankState, m *wirepb.Metrics) {
	if rs.status != stLive {
		return
	}
	if !r.disp.Close(rs.id, m) {
		r.log.Warn("ignoring Metrics for a plan the rank does not hold", "rank", rs.id,
			"epoch", m.GetEpoch(), "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
		return
	}
	r.rep.Metrics(rs.id, m)
}
