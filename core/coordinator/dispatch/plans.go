package dispatch

import (
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// asyncAhead is how many async chunks a rank holds: the one it trains and
// one queued, so it never waits on the coordinator between chunks.
const asyncAhead = 2

// asyncChunk is the async policy's chunk in batches: small, so a round is
// never held long by a rank finishing its chunk.
func (d *Dispatcher) asyncChunk() uint64 {
	if n := d.cfg.Coordinator.ChunkBatches; n > 0 {
		return uint64(n)
	}
	return max(1, (uint64(d.cfg.Coordinator.SyncEvery)+3)/4)
}

// soloPlanTime is about how much training a solo plan holds. With no round
// to bound it, a plan's size only bounds how soon a stop takes effect (the
// plan in training and the one queued behind it finish first), while each
// plan costs a Train call through the plugin boundary and wakes the
// trainer, the rank and the coordinator: on a machine whose cores all
// train, every wake-up takes a core from training threads that wait for
// each other at every parallel region.
const soloPlanTime = 500 * time.Millisecond

// soloReportMS is how often a solo rank reports its batches: with no peer
// to hand its unreported batches to, per-batch frames buy nothing, and on
// a machine whose cores all train they cost it 15-20% of its speed. A
// trainer may train a whole interval between two reports in one call
// (trainer-libtorch does), so the interval is as long as a plan.
const soloReportMS = 500

// window is a set of plans handed out together under a windowed policy;
// it closes when every one of them has its Metrics.
type window struct {
	opened time.Time
	ranks  map[uint32]bool
}

// NextPlans takes the next plans for the live ranks: under a windowed
// policy the next window, else an async chunk for every rank holding fewer
// than asyncAhead. Each plan is its rank's from here on, open until its
// Metrics.
func (d *Dispatcher) NextPlans(live []uint32) map[uint32]*Plan {
	if d.Windowed() {
		return d.WindowPlans(live, false)
	}
	return d.idlePlans(live)
}

// WindowPlans takes the next window's plan for each live rank that has
// work left and opens the window. held plans come with a Sync: each rank
// holds its plan until its round succeeds (Averaged).
func (d *Dispatcher) WindowPlans(live []uint32, held bool) map[uint32]*Plan {
	want := map[uint32]uint64{}
	cw := d.ctl.window()
	switch d.policy {
	case config.PolicyCadence:
		counts := d.cad.plan(live)
		list := make([]uint64, len(live))
		for i, id := range live {
			list[i] = counts[id]
		}
		remainingBatches := (d.work.remaining() + d.batch - 1) / d.batch
		list = finalWindow(list, remainingBatches)
		for i, id := range live {
			want[id] = list[i] * d.batch
		}
	default:
		for _, id := range live {
			want[id] = cw.Interval * d.batch
		}
	}
	plans := map[uint32]*Plan{}
	for _, id := range live {
		if c := d.work.take(id, want[id]); c.Size > 0 {
			plans[id] = &Plan{epoch: d.epoch, rng: c, lrScale: cw.LRScale, held: held}
			d.hand(id, plans[id])
		}
	}
	d.ctl.handed()
	if len(plans) > 0 {
		d.win = &window{opened: time.Now(), ranks: map[uint32]bool{}}
		for id := range plans {
			d.win.ranks[id] = true
		}
	}
	return plans
}

// idlePlans gives every live rank holding fewer than asyncAhead plans its
// next async chunk.
func (d *Dispatcher) idlePlans(live []uint32) map[uint32]*Plan {
	plans := map[uint32]*Plan{}
	lr := d.ctl.window().LRScale
	for _, id := range live {
		if len(d.queues[id].outstanding) >= asyncAhead {
			continue
		}
		if c := d.work.take(id, d.asyncChunk()*d.batch); c.Size > 0 {
			plans[id] = &Plan{epoch: d.epoch, rng: c, lrScale: lr}
			d.hand(id, plans[id])
		}
	}
	if len(plans) > 0 {
		d.ctl.handed()
	}
	return plans
}

// SoloPlan is the next plan of a rank training alone: at least sync_every
// batches, about soloPlanTime of its measured batch time, whose Batch
// reports merge every soloReportMS. It is nil once the epoch's work is
// all handed out.
func (d *Dispatcher) SoloPlan(id uint32) *Plan {
	batches := uint64(d.cfg.Coordinator.SyncEvery)
	if ms := d.queues[id].batchMS; ms > 0 {
		batches = max(batches, uint64(float64(soloPlanTime/time.Millisecond)/ms))
	}
	c := d.work.take(id, batches*d.batch)
	if c.Size == 0 {
		return nil
	}
	lr := d.ctl.window().LRScale
	d.ctl.handed()
	p := &Plan{epoch: d.epoch, rng: c, reportMS: soloReportMS, lrScale: lr}
	d.hand(id, p)
	return p
}

// hand records p as the rank's, outstanding until its Metrics.
func (d *Dispatcher) hand(rank uint32, p *Plan) {
	d.queues[rank].outstanding = append(d.queues[rank].outstanding, p)
}

// EpochPlan is p as the frames that carry it spell it.
func (d *Dispatcher) EpochPlan(p *Plan) *wirepb.EpochPlan {
	return &wirepb.EpochPlan{
		Epoch:            p.epoch,
		PartitionOffset:  p.rng.Offset,
		PartitionSize:    p.rng.Size,
		Seed:             uint64(d.cfg.Run.Seed),
		PickSpace:        d.pickSpace,
		ReportIntervalMs: p.reportMS,
		LrScale:          p.lrScale,
	}
}

// CloseWindow closes the open window, if any (ok false when none is
// open): it returns how long each rank of the window waited between its
// last Metrics and the window's close (the Sync that follows at once).
func (d *Dispatcher) CloseWindow() (waits map[uint32]time.Duration, ok bool) {
	if d.win == nil {
		return nil, false
	}
	now := time.Now()
	waits = map[uint32]time.Duration{}
	for id := range d.win.ranks {
		if q := &d.queues[id]; !q.lastMetrics.IsZero() {
			waits[id] = now.Sub(q.lastMetrics)
		}
	}
	d.lastWindowMS = plugin.Milliseconds(now.Sub(d.win.opened))
	d.win = nil
	return waits, true
}

// Busy reports whether any live rank holds an open plan.
func (d *Dispatcher) Busy(live []uint32) bool {
	for _, id := range live {
		if len(d.queues[id].outstanding) > 0 {
			return true
		}
	}
	return false
}

// Outstanding is the number of open plans rank holds.
func (d *Dispatcher) Outstanding(rank uint32) int { return len(d.queues[rank].outstanding) }

// BatchResult is what the dispatcher made of a Batch report.
type BatchResult struct {
	// Batches is how many batches the frame reports: several for a solo
	// rank's merged reports, whose times are their sums.
	Batches uint64
	// BatchMS is the rank's smoothed batch time after it.
	BatchMS float64
	// Throttle: the rank ran too far ahead of the slowest and must be sent
	// Throttle (async, max_batch_diff).
	Throttle bool
}

// Batch attributes a trained batch to the rank's first plan it can belong
// to (the counts say where a dead rank stopped) and takes its time. live
// are the live ranks; inRound says a round is in flight.
func (d *Dispatcher) Batch(rank uint32, m *wirepb.Batch, live []uint32, inRound bool) BatchResult {
	q := &d.queues[rank]
	n := uint64(m.GetSamples())
	batches := uint64(max(m.GetBatches(), 1))
	if p := q.reportedPlan(m); p != nil {
		add := min(n, p.rng.Size-p.reported)
		q.noteTrained(p, p.reported, add, batches)
		p.reported += add
		p.reportedBatches += batches
		if l := m.GetBatchLoss(); finite(l) {
			p.lossSum += l * float64(batches)
			p.lossBatches += batches
		}
	}
	q.sinceRound += batches
	throttle := d.throttleAhead(rank, live, inRound)
	d.batches += batches
	if ms := m.GetBatchMs() / float64(batches); finite(ms) && ms > 0 {
		if q.batchMS == 0 {
			q.batchMS = ms
		}
		q.batchMS += 0.2 * (ms - q.batchMS)
		if d.cad != nil {
			d.cad.observe(rank, ms)
		}
	}
	return BatchResult{Batches: batches, BatchMS: q.batchMS, Throttle: throttle}
}

// reportedPlan is the open plan a Batch counts against: the one it names,
// else the first the rank has not finished and does not hold.
func (q *queue) reportedPlan(m *wirepb.Batch) *Plan {
	if m.GetPartitionSize() > 0 {
		for _, p := range q.outstanding {
			if p.epoch == m.GetEpoch() && p.rng.Offset == m.GetPartitionOffset() && p.rng.Size == m.GetPartitionSize() {
				return p
			}
		}
		return nil
	}
	for _, p := range q.outstanding {
		if !p.held && p.reported < p.rng.Size {
			return p
		}
	}
	return nil
}

// Close closes the plan a Metrics names; false when the rank holds no
// such plan.
func (d *Dispatcher) Close(rank uint32, m *wirepb.Metrics) bool {
	q := &d.queues[rank]
	i := q.find(m.GetEpoch(), m.GetPartitionOffset(), m.GetPartitionSize())
	if i < 0 {
		return false
	}
	q.outstanding = slices.Delete(q.outstanding, i, i+1)
	q.lastMetrics = time.Now()
	return true
}

// find is the index of the open plan of epoch at [offset, +size), or -1.
func (q *queue) find(epoch, offset, size uint64) int {
	return slices.IndexFunc(q.outstanding, func(p *Plan) bool {
		return p.epoch == epoch && p.rng.Offset == offset && p.rng.Size == size
	})
}
