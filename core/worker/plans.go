package worker

import (
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// planQueue is the rank's work between the coordinator's commands and
// Train: the plans to run, in order (extensions ahead of the chunks
// queued before them); the plans a Sync brought, held until its round
// succeeds; each epoch's shape, which an ExtendPartition does not repeat;
// the cohort's global step, passed to the next plan; and the Throttle that
// holds plans back. It belongs to the main loop's goroutine.
type planQueue struct {
	plans []queuedPlan
	// held are plans that came with a Sync whose round has not succeeded
	// yet: they run after the next successful round, in order.
	held []*wirepb.EpochPlan
	// shapes remembers the permutation (seed, pick space) and rate scale
	// of the latest plan's epoch and the one before it, the epochs an
	// ExtendPartition can still name; last is the latest plan's. Older
	// epochs are forgotten, so a long run's queue does not grow.
	shapes map[uint64]planShape
	last   *planShape
	// step is the coordinator's last global step; fresh says the next
	// plan has not passed it to Train yet.
	step  uint64
	fresh bool
	// throttled holds plans back until the next command.
	throttled bool
}

type queuedPlan struct {
	plan      plugin.Plan
	extension bool
}

// planShape is what an ExtendPartition of an epoch does not repeat: it
// takes them from a plan of that epoch.
type planShape struct {
	seed, pickSpace uint64
	lrScale         float64
}

func newPlanQueue() *planQueue { return &planQueue{shapes: map[uint64]planShape{}} }

// ready reports whether a plan may start: one is queued and no Throttle
// holds it back.
func (q *planQueue) ready() bool { return len(q.plans) > 0 && !q.throttled }

// add queues a plan (StartEpoch, Update, or one a round released) behind
// the others and remembers its epoch's shape.
func (q *planQueue) add(p *wirepb.EpochPlan) {
	shape := planShape{seed: p.GetSeed(), pickSpace: p.GetPickSpace(), lrScale: p.GetLrScale()}
	q.shapes[p.GetEpoch()] = shape
	for e := range q.shapes {
		if e+1 < p.GetEpoch() {
			delete(q.shapes, e)
		}
	}
	q.last = &shape
	q.plans = append(q.plans, queuedPlan{plan: plugin.Plan{
		Epoch:           p.GetEpoch(),
		PartitionOffset: p.GetPartitionOffset(),
		PartitionSize:   p.GetPartitionSize(),
		Seed:            p.GetSeed(),
		PickSpace:       p.GetPickSpace(),
		LRScale:         p.GetLrScale(),
		// The coordinator's interval for the Batch frames serves the
		// plugin's messages too (plugin.Plan.ReportMerge).
		ReportMerge: time.Duration(p.GetReportIntervalMs()) * time.Millisecond,
	}})
}

// extend queues an ExtendPartition range as a plan of its own, to run right
// after the current plan (behind earlier extensions, ahead of later
// chunks). The frame does not repeat the epoch's seed and pick space: they
// come from a plan of that epoch, else from the latest plan, else from
// fallback (the run's seed and the trainer's sample count).
func (q *planQueue) extend(m *wirepb.ExtendPartition, fallback planShape) {
	shape, ok := q.shapes[m.GetEpoch()]
	switch {
	case ok:
	case q.last != nil:
		shape = *q.last
	default:
		shape = fallback
	}
	at := 0
	for at < len(q.plans) && q.plans[at].extension {
		at++
	}
	q.plans = slices.Insert(q.plans, at, queuedPlan{extension: true, plan: plugin.Plan{
		Epoch:           m.GetEpoch(),
		PartitionOffset: m.GetPartitionOffset(),
		PartitionSize:   m.GetPartitionSize(),
		Seed:            shape.seed,
		PickSpace:       shape.pickSpace,
		LRScale:         shape.lrScale,
	}})
}

// drop forgets every plan and the throttle: the coordinator that handed
// them out is lost, and one that comes back hands out its own. The
// epochs' shapes stay.
func (q *planQueue) drop() {
	q.plans, q.held, q.throttled = nil, nil, false
}

// hold keeps a plan a Sync brought until its round succeeds.
func (q *planQueue) hold(p *wirepb.EpochPlan) { q.held = append(q.held, p) }

// roundDone releases what a successful round brought: its global step,
// when it carried one, and the plans held for it, which start now rather
// than after a round trip for Update.
func (q *planQueue) roundDone(globalStep *uint64) {
	if globalStep != nil {
		q.setStep(*globalStep)
	}
	for _, p := range q.held {
		q.add(p)
	}
	q.held = nil
}

// setStep records the cohort's global step for the next plan to pass.
func (q *planQueue) setStep(step uint64) { q.step, q.fresh = step, true }

// restep has the next plan pass the global step again: a fresh trainer's
// learning-rate schedule needs it.
func (q *planQueue) restep() { q.fresh = true }

// next takes the plan to train now; ready must have said there is one.
// The global step goes with it once: between SetGlobalSteps the trainer
// counts on from it (a cohort of one rank runs many plans without a round).
func (q *planQueue) next() queuedPlan {
	qp := q.plans[0]
	q.plans = q.plans[1:]
	if q.fresh {
		qp.plan.GlobalStep, q.fresh = q.step, false
	}
	return qp
}
