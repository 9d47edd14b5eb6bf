package coordinator

import (
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/membership"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// stepTraining makes one move of the training phase.
func (r *runner) stepTraining() bool {
	if r.round == nil && r.reissue == nil && r.disp.Training() && r.ranks.Solo() && !r.sessions.Pending() {
		// The cohort is down to one rank whose averager said a round alone
		// leaves its arena as it is: rounds would change nothing.
		return r.stepSolo()
	}
	if !r.disp.Windowed() && r.disp.Training() && !r.stopReq && (r.round == nil || r.round.overlap) {
		// Async: idle ranks get their next chunk at once, and one more
		// queued behind it, so a rank whose round runs beside its training
		// never runs dry (during a round that blocks training they get it
		// with the round's Update).
		if plans := r.disp.NextPlans(r.ranks.Live()); len(plans) > 0 {
			r.deliver(r.ranks.Live(), plans, nil)
			return true
		}
	}
	if r.round != nil {
		return false
	}
	if r.reissue != nil {
		// An aborted round runs again once the averaging group is
		// re-formed: a round issued before NewSession would meet the old
		// group.
		if r.sessions.Pending() {
			return false
		}
		ri := r.reissue
		r.reissue = nil
		r.issueRound(ri.mode, ri.root, ri.initial)
		return true
	}
	if !r.disp.Training() {
		return false // round 0 has not completed yet
	}
	busy := r.disp.Busy(r.ranks.Live())
	if r.disp.Windowed() {
		if busy {
			return false
		}
		if waits, ok := r.disp.CloseWindow(); ok {
			r.rep.WindowClosed(waits)
		}
		if r.disp.Unsynced(r.ranks.Live()) > 0 {
			if r.sessions.Pending() {
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
			r.deliver(r.ranks.Live(), r.disp.NextPlans(r.ranks.Live()), nil)
			return true
		}
		r.endEpoch()
		return true
	}

	// Async.
	if busy && !r.sessions.Pending() && r.disp.AsyncRoundDue(r.ranks.Live()) {
		r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
		return true
	}
	if busy || (!r.stopReq && r.disp.Remaining() > 0) {
		return false
	}
	if r.disp.Unsynced(r.ranks.Live()) > 0 {
		if r.sessions.Pending() {
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

// stepSolo moves a solo cohort: no rounds, and plans of at least
// sync_every batches (about soloPlanTime of the rank's measured batch time)
// with the next one always queued behind the one the rank trains, so it
// never waits on the coordinator between plans, and whose Batch reports
// merge every soloReportMS. Where a round would close
// the work (the rank idle with batches since the last one) the checkpoint
// snapshot and the global step are brought up to date as a round would.
func (r *runner) stepSolo() bool {
	id := r.ranks.Live()[0]
	if !r.stopReq && r.disp.Outstanding(id) < 2 {
		if p := r.disp.SoloPlan(id); p != nil {
			r.deliver([]uint32{id}, map[uint32]*dispatch.Plan{id: p}, nil)
			return true
		}
	}
	if r.disp.Outstanding(id) > 0 {
		return false
	}
	// A window opened before the cohort was down to this rank closes.
	if waits, ok := r.disp.CloseWindow(); ok {
		r.rep.WindowClosed(waits)
	}
	if r.disp.Unsynced([]uint32{id}) > 0 {
		r.disp.Settle(id)
		r.snap = r.progressNow()
		r.ranks.Broadcast(&wirepb.SetGlobalStep{GlobalStep: r.disp.GlobalStep()})
	}
	if r.stopReq {
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, checkpoint.ReasonInterrupted, record.StatusStopped, nil)
		return true
	}
	r.endEpoch()
	return true
}

// onBatch attributes a trained batch to the rank's first plan it can
// belong to; the counts say where a dead rank stopped.
func (r *runner) onBatch(id uint32, m *wirepb.Batch) {
	if r.ranks.Status(id) != membership.Live || !r.disp.Training() {
		return
	}
	b := r.disp.Batch(id, m, r.ranks.Live(), r.round != nil)
	if b.Throttle {
		r.ranks.Send(id, &wirepb.Throttle{})
	}
	if done, loss, due := r.rep.Batch(id, m, b.Batches, b.BatchMS); due {
		r.emit(Progress{Kind: ProgressSamples, Done: done, Loss: loss})
	}
}

// onMetrics closes the plan it names.
func (r *runner) onMetrics(id uint32, m *wirepb.Metrics) {
	if r.ranks.Status(id) != membership.Live {
		return
	}
	if !r.disp.Close(id, m) {
		r.log.Warn("ignoring Metrics for a plan the rank does not hold", "rank", id,
			"epoch", m.GetEpoch(), "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
		return
	}
	r.rep.Metrics(id, m)
}
