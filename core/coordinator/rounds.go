package coordinator

import (
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/membership"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// round is an averaging round in flight.
type round struct {
	num     uint64
	mode    wirepb.SyncMode
	root    uint32
	issued  time.Time
	waiting map[uint32]bool
	acks    map[uint32]*wirepb.SyncAck
	initial bool // round 0: the run starts when it completes
	// overlap: the ranks may run it beside training (Sync.overlap).
	overlap bool
	// snap, when the Sync carried the next window's plans, is the
	// checkpoint snapshot as of the round (taken at issue: ranks start
	// those plans before the round completes everywhere).
	snap *checkpoint.Progress
}

// reissue is a round to run again after an abort, once the group is
// re-formed.
type reissue struct {
	mode    wirepb.SyncMode
	root    uint32
	initial bool
}

// issueRound sends Sync to every live rank.
func (r *runner) issueRound(mode wirepb.SyncMode, root uint32, initial bool) {
	rd := &round{
		num:     r.roundSeq,
		mode:    mode,
		root:    root,
		issued:  time.Now(),
		waiting: map[uint32]bool{},
		acks:    map[uint32]*wirepb.SyncAck{},
		initial: initial,
	}
	r.roundSeq++
	r.round = rd
	if !initial {
		if p := r.pendingConsensus(rd.num); p != nil {
			r.consensusNow(p)
		}
	}
	live := r.ranks.Live()
	var plans map[uint32]*dispatch.Plan
	var step *uint64
	if !initial && r.disp.Windowed() && !r.stopReq && r.disp.Training() && r.disp.Remaining() > 0 && !r.disp.Busy(live) {
		// The next window is known now: each rank gets its plan with the
		// Sync and starts it when its round succeeds, instead of waiting
		// a round trip for Update.
		snap := r.progressNow()
		rd.snap = &snap
		gs := r.disp.GlobalStep()
		step = &gs
		plans = r.disp.WindowPlans(live, true)
	}
	overlap := r.policy == config.PolicyAsync && r.cfg.Coordinator.AsyncOverlap && mode == wirepb.SyncMode_SYNC_MODE_AVERAGE && !initial
	rd.overlap = overlap
	r.disp.RoundIssued(live, mode == wirepb.SyncMode_SYNC_MODE_AVERAGE)
	for _, id := range live {
		rd.waiting[id] = true
		msg := &wirepb.Sync{Round: rd.num, Mode: mode, Root: root, Overlap: overlap}
		if p := plans[id]; p != nil {
			r.rep.Handed(id)
			msg.NextPlan, msg.GlobalStep = r.disp.EpochPlan(p), step
		}
		r.ranks.Send(id, msg)
	}
	r.log.Debug("round issued", "round", rd.num, "mode", mode.String(), "root", root, "ranks", len(rd.waiting), "next_plans", len(plans))
}

func (r *runner) onSyncAck(id uint32, m *wirepb.SyncAck) {
	rd := r.round
	if rd == nil || m.GetRound() != rd.num || !rd.waiting[id] {
		r.log.Warn("ignoring a SyncAck for no round in flight", "rank", id, "round", m.GetRound())
		return
	}
	delete(rd.waiting, id)
	rd.acks[id] = m
	switch {
	case m.GetAborted():
		r.log.Info("round aborted on a rank", "rank", id, "round", rd.num, "error", m.GetError())
	case m.GetError() != "":
		r.log.Warn("round failed on a rank", "rank", id, "round", rd.num, "error", m.GetError())
	default:
		r.disp.Averaged(id)
		if rd.initial && rd.mode == wirepb.SyncMode_SYNC_MODE_AVERAGE && r.cb != nil {
			r.cb.averaged = true
		}
	}
	r.checkRound()
}

// checkRound resolves the round in flight once every live rank acked:
// complete, or to be run again when any live rank aborted (as AVERAGE if
// all did, else as a BROADCAST from the lowest that completed, so the
// cohort cannot split).
func (r *runner) checkRound() {
	rd := r.round
	if rd == nil || len(rd.waiting) > 0 {
		return
	}
	var completed []uint32
	aborted := false
	for _, id := range r.ranks.Live() {
		ack := rd.acks[id]
		if ack == nil {
			continue
		}
		if ack.GetAborted() || ack.GetError() != "" {
			aborted = true
		} else {
			completed = append(completed, id)
		}
	}
	if len(completed) == 0 && !aborted {
		return // no live member left; the death handling ends the run
	}
	if aborted {
		ri := &reissue{mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, initial: rd.initial}
		if rd.initial {
			// Round 0 exists to make every rank start equal: only a
			// broadcast does that.
			ri.mode = wirepb.SyncMode_SYNC_MODE_BROADCAST
			ri.root = r.ranks.Live()[0]
			if r.cb != nil && r.ranks.Status(r.cb.root) == membership.Live {
				// After a comeback only the holders' models may start it.
				ri.root = r.cb.root
			}
		}
		if len(completed) > 0 {
			ri.mode, ri.root = wirepb.SyncMode_SYNC_MODE_BROADCAST, completed[0]
		}
		r.log.Info("round will run again on the re-formed group", "round", rd.num,
			"mode", ri.mode.String(), "root", ri.root)
		r.round = nil
		r.reissue = ri
		return
	}
	r.completeRound(rd)
}

// completeRound closes a round: statistics, the checkpoint snapshot, then
// Update (with the next plans) and SetGlobalStep to every live rank.
func (r *runner) completeRound(rd *round) {
	r.round = nil
	took := time.Since(rd.issued)
	ms := plugin.Milliseconds(took)
	acks := map[uint32]*wirepb.SyncAck{}
	for id, ack := range rd.acks {
		if r.ranks.Status(id) == membership.Live {
			acks[id] = ack
		}
	}
	r.rep.Round(rd.num, r.epoch+1, took, acks, rd.initial, r.disp.Windowed())
	if rd.initial {
		r.log.Info("round 0 complete: every rank holds the same parameters", "round", rd.num, "mode", rd.mode.String(), "ms", ms)
		r.startTraining()
		r.consRound = rd.num
		r.consensusNow(nil)
		if r.phase != phTraining {
			return
		}
	} else {
		r.disp.Consensus(r.ranks.Live())
		r.disp.RoundDone(rd.num, r.epoch+1, ms, divergences(rd, r.ranks.Live()), rd.mode == wirepb.SyncMode_SYNC_MODE_AVERAGE)
		if rd.snap != nil {
			// The work as of the round's issue (the plans it carried are
			// still to train), the controller as of its end.
			r.snap = *rd.snap
			r.snap.Controller = r.disp.ControllerState()
		} else {
			r.snap = r.progressNow()
		}
		r.consRound = rd.num
		r.consensusNow(nil)
	}
	version := rd.num
	switch {
	case r.stopReq, r.disp.Windowed() && r.disp.Busy(r.ranks.Live()), r.ranks.Solo() && !r.sessions.Pending():
		// Stopping, or the ranks hold plans already (brought by the
		// Sync, or extensions after a death), or the rank is alone and
		// stepSolo hands out its plans: no new window here.
		r.deliver(r.ranks.Live(), nil, &version)
	case !r.disp.Windowed() || r.disp.Remaining() > 0:
		r.deliver(r.ranks.Live(), r.disp.NextPlans(r.ranks.Live()), &version)
	default:
		r.deliver(r.ranks.Live(), nil, &version)
	}
	if rd.snap == nil {
		r.ranks.Broadcast(&wirepb.SetGlobalStep{GlobalStep: r.disp.GlobalStep()})
	}
}

// divergences lists the divergence each live rank that trained reported
// for rd, in rank order (so their mean is the same in a resumed run).
func divergences(rd *round, live []uint32) []float64 {
	var divs []float64
	for _, id := range live {
		if ack := rd.acks[id]; ack != nil && ack.Divergence != nil && ack.GetWeight() > 0 {
			divs = append(divs, ack.GetDivergence())
		}
	}
	return divs
}

// deliver sends plans: with version, an Update to every live rank (with
// its plan, if any); without, a StartEpoch to each rank that has one.
func (r *runner) deliver(live []uint32, plans map[uint32]*dispatch.Plan, version *uint64) {
	for _, id := range live {
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
			r.ranks.Send(id, u)
		case p != nil:
			r.ranks.Send(id, &wirepb.StartEpoch{Plan: r.disp.EpochPlan(p)})
		}
	}
}

// progressNow is the state of the epoch as the models of the last round
// see it: everything not yet dispatched plus every plan still open.
func (r *runner) progressNow() checkpoint.Progress {
	p := checkpoint.Progress{Snapshot: r.disp.Snapshot(r.ranks.Live())}
	if r.disp.Training() {
		p.Partial = r.rep.Partial()
	}
	return p
}
