package coordinator

import (
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// windowed reports whether the policy hands out work in windows that all
// close at one round (sync, cadence), rather than streaming it (async).
func (r *runner) windowed() bool { return r.policy != config.PolicyAsync }

// shared reports whether the policy draws chunks from one epoch pool
// instead of per-rank partitions: under cadence and async a faster rank
// must be able to take more than an equal share.
func (r *runner) shared() bool { return r.policy != config.PolicySync }

// asyncAhead is how many async chunks a rank holds: the one it trains and
// one queued, so it never waits on the coordinator between chunks.
const asyncAhead = 2

// asyncChunk is the async policy's chunk in batches: small, so a round is
// never held long by a rank finishing its chunk.
func (r *runner) asyncChunk() uint64 {
	if n := r.cfg.Coordinator.ChunkBatches; n > 0 {
		return uint64(n)
	}
	return max(1, (uint64(r.cfg.Coordinator.SyncEvery)+3)/4)
}

// stepTraining makes one move of the training phase.
func (r *runner) stepTraining() bool {
	if r.round == nil && r.reissue == nil && r.work != nil && r.solo() {
		return r.stepSolo()
	}
	if !r.windowed() && r.work != nil && !r.stopReq && (r.round == nil || r.round.overlap) {
		// Async: idle ranks get their next chunk at once, and one more
		// queued behind it, so a rank whose round runs beside its training
		// never runs dry (during a round that blocks training they get it
		// with the round's Update).
		if r.dispatchIdle(nil) {
			return true
		}
	}
	if r.round != nil {
		return false
	}
	if r.reissue != nil {
		return r.stepReissue()
	}
	if r.work == nil {
		return false // round 0 has not completed yet
	}
	busy := r.anyOutstanding()
	if r.windowed() {
		if busy {
			return false
		}
		if r.win != nil {
			r.closeWindow()
		}
		if r.unsynced() > 0 {
			if r.session != nil {
				return false
			}
			r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
			return true
		}
		if r.stopReq {
			r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, ReasonInterrupted, StatusStopped, nil)
			return true
		}
		if r.work.remaining() > 0 {
			r.nextWindow(nil)
			return true
		}
		r.endEpoch()
		return true
	}

	// Async.
	if busy && r.session == nil && r.asyncRoundDue() {
		r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
		return true
	}
	if busy || (!r.stopReq && r.work.remaining() > 0) {
		return false
	}
	if r.unsynced() > 0 {
		if r.session != nil {
			return false
		}
		r.issueRound(wirepb.SyncMode_SYNC_MODE_AVERAGE, 0, false)
		return true
	}
	if r.stopReq {
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, ReasonInterrupted, StatusStopped, nil)
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

// soloPlanTime is about how much training a solo plan holds. With no round
// to bound it, a plan's size only bounds how soon a stop takes effect (the
// plan in training and the one queued behind it finish first), while each
// plan costs a Train call through the plugin boundary.
const soloPlanTime = 200 * time.Millisecond

// soloReportMS is how often a solo rank reports its batches: with no peer
// to hand its unreported batches to, per-batch frames buy nothing, and on
// a machine whose cores all train they cost it 15-20% of its speed.
const soloReportMS = 100

// stepSolo moves a solo cohort: no rounds, and plans of at least
// sync_every batches (about soloPlanTime of the rank's measured batch time)
// with the next one always queued behind the one the rank trains, so it
// never waits on the coordinator between plans, and whose Batch reports
// merge every soloReportMS. Where a round would close
// the work (the rank idle with batches since the last one) the checkpoint
// snapshot and the global step are brought up to date as a round would.
func (r *runner) stepSolo() bool {
	id := r.live()[0]
	rs := r.ranks[id]
	if !r.stopReq && len(rs.outstanding) < 2 {
		batches := uint64(r.cfg.Coordinator.SyncEvery)
		if rs.batchMS > 0 {
			batches = max(batches, uint64(float64(soloPlanTime/time.Millisecond)/rs.batchMS))
		}
		if c := r.work.take(id, batches*r.batch); c.Size > 0 {
			lr := r.ctl.window().LRScale
			r.ctl.handed()
			r.deliver([]uint32{id}, map[uint32]*plan{id: {epoch: r.epoch, rng: c, reportMS: soloReportMS, lrScale: lr}}, nil)
			return true
		}
	}
	if len(rs.outstanding) > 0 {
		return false
	}
	if r.win != nil {
		r.closeWindow() // opened before the cohort was down to this rank
	}
	if rs.sinceRound > 0 {
		rs.sinceRound = 0
		r.snap = r.progressNow()
		r.broadcast(&wirepb.SetGlobalStep{GlobalStep: r.globalStep()})
	}
	if r.stopReq {
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, ReasonInterrupted, StatusStopped, nil)
		return true
	}
	r.endEpoch()
	return true
}

func (r *runner) anyOutstanding() bool {
	for _, id := range r.live() {
		if len(r.ranks[id].outstanding) > 0 {
			return true
		}
	}
	return false
}

// window is a set of plans handed out together under a windowed policy;
// it closes when every one of them has its Metrics.
type window struct {
	opened time.Time
	ranks  map[uint32]bool
}

// nextWindow hands each live rank its plan for the next window, in the
// round's Update when version is set, else as StartEpoch.
func (r *runner) nextWindow(version *uint64) {
	live := r.live()
	r.deliver(live, r.windowPlans(live), version)
}

// windowPlans takes the next window's plan for each live rank that has
// work left and opens the window.
func (r *runner) windowPlans(live []uint32) map[uint32]*plan {
	want := map[uint32]uint64{}
	cw := r.ctl.window()
	switch r.policy {
	case config.PolicyCadence:
		counts := r.cad.plan(live)
		list := make([]uint64, len(live))
		for i, id := range live {
			list[i] = counts[id]
		}
		remainingBatches := (r.work.remaining() + r.batch - 1) / r.batch
		list = finalWindow(list, remainingBatches)
		for i, id := range live {
			want[id] = list[i] * r.batch
		}
	default:
		for _, id := range live {
			want[id] = cw.Interval * r.batch
		}
	}
	plans := map[uint32]*plan{}
	for _, id := range live {
		if c := r.work.take(id, want[id]); c.Size > 0 {
			plans[id] = &plan{epoch: r.epoch, rng: c, lrScale: cw.LRScale}
		}
	}
	r.ctl.handed()
	if len(plans) > 0 {
		r.win = &window{opened: time.Now(), ranks: map[uint32]bool{}}
		for id := range plans {
			r.win.ranks[id] = true
		}
	}
	return plans
}

// dispatchIdle gives every live rank holding fewer than asyncAhead plans its next
// async chunk; it reports whether it sent anything.
func (r *runner) dispatchIdle(version *uint64) bool {
	live := r.live()
	plans := map[uint32]*plan{}
	lr := r.ctl.window().LRScale
	for _, id := range live {
		if len(r.ranks[id].outstanding) >= asyncAhead {
			continue
		}
		if c := r.work.take(id, r.asyncChunk()*r.batch); c.Size > 0 {
			plans[id] = &plan{epoch: r.epoch, rng: c, lrScale: lr}
		}
	}
	if len(plans) > 0 {
		r.ctl.handed()
	}
	if version == nil && len(plans) == 0 {
		return false
	}
	r.deliver(live, plans, version)
	return len(plans) > 0
}

// deliver sends plans: with version, an Update to every live rank (with
// its plan, if any); without, a StartEpoch to each rank that has one.
func (r *runner) deliver(live []uint32, plans map[uint32]*plan, version *uint64) {
	for _, id := range live {
		rs := r.ranks[id]
		p := plans[id]
		r.hand(rs, p)
		switch {
		case version != nil:
			u := &wirepb.Update{Version: *version}
			if p != nil {
				u.NextPlan = r.epochPlan(p)
			}
			r.send(rs, u)
		case p != nil:
			r.send(rs, &wirepb.StartEpoch{Plan: r.epochPlan(p)})
		}
	}
}

// hand records p (if any) as the rank's, outstanding until its Metrics.
func (r *runner) hand(rs *rankState, p *plan) {
	if p == nil {
		return
	}
	rs.outstanding = append(rs.outstanding, p)
	if r.agg != nil {
		r.agg.rank(rs.id).windows++
	}
}

func (r *runner) epochPlan(p *plan) *wirepb.EpochPlan {
	return &wirepb.EpochPlan{
		Epoch:            p.epoch,
		PartitionOffset:  p.rng.Offset,
		PartitionSize:    p.rng.Size,
		Seed:             uint64(r.cfg.Run.Seed),
		PickSpace:        r.pickSpace,
		ReportIntervalMs: p.reportMS,
		LrScale:          p.lrScale,
	}
}

// closeWindow records how long each rank of the window waited between its
// last Metrics and the window's close (the Sync that follows at once).
func (r *runner) closeWindow() {
	now := time.Now()
	for id := range r.win.ranks {
		rs := r.ranks[id]
		if rs.status != stLive || rs.lastMetrics.IsZero() {
			continue
		}
		r.agg.addWait(id, now.Sub(rs.lastMetrics))
	}
	r.agg.windows++
	r.lastWindowMS = float64(now.Sub(r.win.opened)) / float64(time.Millisecond)
	r.win = nil
}

// onBatch attributes a trained batch to the rank's first plan it can
// belong to; the counts say where a dead rank stopped.
func (r *runner) onBatch(rs *rankState, m *wirepb.Batch) {
	if rs.status != stLive || r.work == nil {
		return
	}
	n := uint64(m.GetSamples())
	// A frame may report several batches of one plan (a solo rank's
	// merged reports): its times are their sums.
	batches := uint64(max(m.GetBatches(), 1))
	if p := rs.reportedPlan(m); p != nil {
		p.reported += min(n, p.rng.Size-p.reported)
		p.reportedBatches += batches
		if l := m.GetBatchLoss(); finite(l) {
			p.lossSum += l * float64(batches)
			p.lossBatches += batches
		}
	}
	if l := m.GetBatchLoss(); finite(l) {
		r.lastLoss = &l
	}
	rs.sinceRound += batches
	r.throttleAhead(rs)
	rs.batches += batches
	rs.epoch = m.GetEpoch()
	rs.stepCount = m.GetStepCount()
	r.noteBatchLoss(m.GetBatchLoss(), batches)
	rs.samples += n
	if ms := m.GetBatchMs() / float64(batches); finite(ms) && ms > 0 {
		if rs.batchMS == 0 {
			rs.batchMS = ms
		}
		rs.batchMS += 0.2 * (ms - rs.batchMS)
		if r.cad != nil {
			r.cad.observe(rs.id, ms)
		}
	}
	if r.agg != nil {
		ra := r.agg.rank(rs.id)
		ra.batches += batches
		ra.samples += n
		if ms := m.GetBatchMs(); finite(ms) && ms > 0 {
			ra.trainMS += ms
		}
		r.agg.trained += n
		if now := time.Now(); now.Sub(r.lastProgress) >= 100*time.Millisecond {
			r.lastProgress = now
			r.emit(Progress{Kind: ProgressSamples, Done: r.agg.prior.Samples + r.agg.trained, Loss: r.lastLoss})
		}
	}
}

// reportedPlan is the open plan a Batch counts against: the one it names,
// else the first the rank has not finished and does not hold.
func (rs *rankState) reportedPlan(m *wirepb.Batch) *plan {
	if m.GetPartitionSize() > 0 {
		for _, p := range rs.outstanding {
			if p.epoch == m.GetEpoch() && p.rng.Offset == m.GetPartitionOffset() && p.rng.Size == m.GetPartitionSize() {
				return p
			}
		}
		return nil
	}
	for _, p := range rs.outstanding {
		if !p.held && p.reported < p.rng.Size {
			return p
		}
	}
	return nil
}

// onMetrics closes the plan it names.
func (r *runner) onMetrics(rs *rankState, m *wirepb.Metrics) {
	if rs.status != stLive {
		return
	}
	i := slices.IndexFunc(rs.outstanding, func(p *plan) bool {
		return p.epoch == m.GetEpoch() && p.rng.Offset == m.GetPartitionOffset() && p.rng.Size == m.GetPartitionSize()
	})
	if i < 0 {
		r.log.Warn("ignoring Metrics for a plan the rank does not hold", "rank", rs.id,
			"epoch", m.GetEpoch(), "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
		return
	}
	rs.outstanding = slices.Delete(rs.outstanding, i, i+1)
	rs.lastMetrics = time.Now()
	if r.agg != nil {
		if v := m.GetRoundWaitMs(); finite(v) && v > 0 {
			r.agg.rank(rs.id).roundWaitMS += v
		}
		r.agg.samples += m.GetSamples()
		r.agg.batches += m.GetBatches()
		if l := m.GetAvgLoss(); finite(l) && m.GetBatches() > 0 {
			r.agg.lossSum += l * float64(m.GetBatches())
			r.agg.lossBatches += m.GetBatches()
		}
		r.noteScalars(rs.id, m)
	}
}

// countUnclosed adds to the epoch's figures what a departing rank's Batch
// reports say it trained of a plan no Metrics will close: those samples
// are not handed out again (see plan.unfinished), so without this the
// epoch would come up short of its data set.
func (r *runner) countUnclosed(p *plan) {
	if r.agg == nil || p.epoch != r.epoch {
		return
	}
	r.agg.samples += min(p.reported, p.rng.Size)
	r.agg.batches += p.reportedBatches
	r.agg.lossSum += p.lossSum
	r.agg.lossBatches += p.lossBatches
}
