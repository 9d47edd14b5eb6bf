package coordinator

import (
	"fmt"
	"math"
	"time"

	"github.com/cohortdl/cohort/core/config"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// round is an averaging round in flight.
type round struct {
	num     uint64
	mode    wirepb.SyncMode
	root    uint32
	issued  time.Time
	waiting map[uint32]bool
	acks    map[uint32]*wirepb.SyncAck
	// since is each rank's sinceRound at issue: what the round averages.
	// Batches reported after (a rank training while its round runs) are
	// for the next one.
	since   map[uint32]uint64
	initial bool // round 0: the run starts when it completes
	// overlap: the ranks may run it beside training (Sync.overlap).
	overlap bool
	// snap, when the Sync carried the next window's plans, is the
	// checkpoint snapshot as of the round (taken at issue: ranks start
	// those plans before the round completes everywhere).
	snap *progress
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
		since:   map[uint32]uint64{},
		initial: initial,
	}
	r.roundSeq++
	r.round = rd
	live := r.live()
	var plans map[uint32]*plan
	var step *uint64
	if !initial && r.windowed() && !r.stopReq && r.work != nil && r.work.remaining() > 0 && !r.anyOutstanding() {
		// The next window is known now: each rank gets its plan with the
		// Sync and starts it when its round succeeds, instead of waiting
		// a round trip for Update.
		snap := r.progressNow()
		rd.snap = &snap
		gs := r.globalStep()
		step = &gs
		plans = r.windowPlans(live)
	}
	overlap := r.policy == config.PolicyAsync && r.cfg.Coordinator.AsyncOverlap && mode == wirepb.SyncMode_SYNC_MODE_AVERAGE && !initial
	rd.overlap = overlap
	for _, id := range live {
		r.ranks[id].throttled = false // the Sync releases it
		rd.waiting[id] = true
		rd.since[id] = r.ranks[id].sinceRound
		msg := &wirepb.Sync{Round: rd.num, Mode: mode, Root: root, Overlap: overlap}
		if p := plans[id]; p != nil {
			p.held = true
			r.hand(r.ranks[id], p)
			msg.NextPlan, msg.GlobalStep = r.epochPlan(p), step
		}
		r.send(r.ranks[id], msg)
	}
	r.log.Debug("round issued", "round", rd.num, "mode", mode.String(), "root", root, "ranks", len(rd.waiting), "next_plans", len(plans))
}

func (r *runner) onSyncAck(rs *rankState, m *wirepb.SyncAck) {
	rd := r.round
	if rd == nil || m.GetRound() != rd.num || !rd.waiting[rs.id] {
		r.log.Warn("ignoring a SyncAck for no round in flight", "rank", rs.id, "round", m.GetRound())
		return
	}
	delete(rd.waiting, rs.id)
	rd.acks[rs.id] = m
	switch {
	case m.GetAborted():
		r.log.Info("round aborted on a rank", "rank", rs.id, "round", rd.num, "error", m.GetError())
	case m.GetError() != "":
		r.log.Warn("round failed on a rank", "rank", rs.id, "round", rd.num, "error", m.GetError())
	default:
		rs.sinceRound -= min(rd.since[rs.id], rs.sinceRound)
		// The rank starts what it held for a round once one succeeds.
		for _, p := range rs.outstanding {
			p.held = false
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
	for _, id := range r.live() {
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
			ri.root = r.live()[0]
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

// stepReissue runs an aborted round again once the averaging group is
// re-formed: a round issued before NewSession would meet the old group.
func (r *runner) stepReissue() bool {
	if r.session != nil {
		return false
	}
	ri := r.reissue
	r.reissue = nil
	r.issueRound(ri.mode, ri.root, ri.initial)
	return true
}

// completeRound closes a round: statistics, the checkpoint snapshot, then
// Update (with the next plans) and SetGlobalStep to every live rank.
func (r *runner) completeRound(rd *round) {
	r.round = nil
	ms := float64(time.Since(rd.issued)) / float64(time.Millisecond)
	var bytes float64
	minMS := math.Inf(1)
	for id, ack := range rd.acks {
		if r.ranks[id].status != stLive {
			continue
		}
		bytes += float64(ack.GetBytesMoved())
		r.hostCopy += ack.GetHostCopyBytes()
		if v := ack.GetRoundMs(); finite(v) && v >= 0 {
			minMS = min(minMS, v)
		}
	}
	r.rounds++
	r.roundMS += ms
	r.bytes += bytes
	r.noteRound(rd.num, time.Since(rd.issued), bytes)
	if rd.initial {
		r.log.Info("round 0 complete: every rank holds rank 0's parameters", "ms", ms)
		r.startTraining()
		if r.phase != phTraining {
			return
		}
	} else {
		r.agg.rounds++
		r.agg.roundMS += ms
		if !r.windowed() && !math.IsInf(minMS, 1) {
			for id, ack := range rd.acks {
				if v := ack.GetRoundMs(); r.ranks[id].status == stLive && finite(v) {
					r.agg.addWait(id, time.Duration((v-minMS)*float64(time.Millisecond)))
				}
			}
		}
		if rd.mode == wirepb.SyncMode_SYNC_MODE_AVERAGE {
			r.ctl.observeRound(rd.num, r.epoch+1, r.roundDivergences(rd))
		}
		if r.cad != nil && r.lastWindowMS > 0 {
			if from, ok := r.cad.observeWindow(ms, r.lastWindowMS, r.ctl.verdict()); ok {
				rule := RuleOverhead
				if r.cad.base < from {
					rule = RuleTighten
				}
				lr := r.ctl.lrScale()
				r.ctl.decide(ControllerDecision{Round: rd.num, Epoch: r.epoch + 1, Rule: rule,
					Divergence: r.ctl.st.DivergenceEMA, From: from, To: r.cad.base, LRFrom: lr, LRTo: lr})
			}
			r.lastWindowMS = 0
		}
		if rd.snap != nil {
			// The work as of the round's issue (the plans it carried are
			// still to train), the controller as of its end.
			r.snap = *rd.snap
			r.snap.ctl = r.ctl.state()
		} else {
			r.snap = r.progressNow()
		}
	}
	version := rd.num
	switch {
	case r.stopReq, r.windowed() && r.anyOutstanding(), r.solo():
		// Stopping, or the ranks hold plans already (brought by the
		// Sync, or extensions after a death), or the rank is alone and
		// stepSolo hands out its plans: no new window here.
		r.deliver(r.live(), nil, &version)
	case r.windowed() && r.work.remaining() > 0:
		r.nextWindow(&version)
	case !r.windowed():
		r.dispatchIdle(&version)
	default:
		r.deliver(r.live(), nil, &version)
	}
	if rd.snap == nil {
		r.broadcast(&wirepb.SetGlobalStep{GlobalStep: r.globalStep()})
	}
}

// unsynced is the number of batches the live ranks trained since their
// last completed round.
func (r *runner) unsynced() uint64 {
	var n uint64
	for _, id := range r.live() {
		n += r.ranks[id].sinceRound
	}
	return n
}

// asyncRoundDue: the slowest busy rank has trained the controller's
// interval since the last round, or every busy rank is throttled (only the
// round's Sync releases them).
func (r *runner) asyncRoundDue() bool {
	slowest := uint64(math.MaxUint64)
	allThrottled := true
	for _, id := range r.live() {
		if rs := r.ranks[id]; len(rs.outstanding) > 0 {
			slowest = min(slowest, rs.sinceRound)
			allThrottled = allThrottled && rs.throttled
		}
	}
	return slowest != math.MaxUint64 && (slowest >= r.ctl.st.Interval || allThrottled)
}

// throttleAhead parks rs (async, coordinator.max_batch_diff) when it has
// trained more than max_batch_diff batches beyond the slowest busy rank
// since the last round: its next plans wait for the round, so no rank's
// model runs far ahead of the average it will be folded into.
func (r *runner) throttleAhead(rs *rankState) {
	limit := uint64(r.cfg.Coordinator.MaxBatchDiff)
	if r.windowed() || limit == 0 || rs.throttled || r.round != nil {
		return
	}
	slowest := uint64(math.MaxUint64)
	for _, id := range r.live() {
		if o := r.ranks[id]; o != rs && len(o.outstanding) > 0 {
			slowest = min(slowest, o.sinceRound)
		}
	}
	if slowest == math.MaxUint64 || rs.sinceRound <= slowest+limit {
		return
	}
	rs.throttled = true
	r.ctl.throttles++
	r.send(rs, &wirepb.Throttle{})
	r.log.Debug("throttled a rank ahead of the slowest", "rank", rs.id, "since_round", rs.sinceRound,
		"slowest", slowest, "max_batch_diff", limit)
}

// globalStep is the cohort's optimizer step count in one rank's terms: the
// batches every rank trained, divided by the world size. A trainer's
// learning-rate schedule follows it, so it advances as a single rank's own
// count would (and as a DDP run of the same world's would), whichever rank
// did the work.
func (r *runner) globalStep() uint64 {
	var batches uint64
	for _, rs := range r.ranks {
		batches += rs.batches
	}
	return r.stepsBefore + batches/uint64(r.world)
}

// roundDivergences lists the divergence each live rank that trained
// reported for rd, in rank order (so their mean is the same in a resumed
// run).
func (r *runner) roundDivergences(rd *round) []float64 {
	var divs []float64
	for _, id := range r.live() {
		if ack := rd.acks[id]; ack != nil && ack.Divergence != nil && ack.GetWeight() > 0 {
			divs = append(divs, ack.GetDivergence())
		}
	}
	return divs
}

// logDecision logs a controller decision.
func (r *runner) logDecision(d ControllerDecision) {
	r.log.Info("controller: "+d.Rule, "round", d.Round, "epoch", d.Epoch, "divergence", d.Divergence,
		"eval_loss", d.EvalLoss, "interval", fmt.Sprintf("%d -> %d", d.From, d.To),
		"lr_scale", fmt.Sprintf("%g -> %g", d.LRFrom, d.LRTo))
}

// controllerSummary is the controller's account; under cadence the
// interval is the window's base, which the cadence sizes.
func (r *runner) controllerSummary() *ControllerSummary {
	s := r.ctl.summary()
	if r.cad != nil {
		s.Interval = r.cad.base
	}
	return s
}
