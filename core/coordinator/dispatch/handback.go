package dispatch

import (
	"slices"
)

// Trained is what a rank's Batch reports say it trained of a plan no
// Metrics will close: those samples are not handed out again (see
// Plan.unfinished), so the epoch's figures must count them.
type Trained struct {
	Epoch       uint64
	Samples     uint64
	Batches     uint64
	LossSum     float64 // Σ loss·batches over the reports with a finite loss
	LossBatches uint64
}

func (p *Plan) trained() Trained {
	return Trained{Epoch: p.epoch, Samples: min(p.reported, p.rng.Size), Batches: p.reportedBatches,
		LossSum: p.lossSum, LossBatches: p.lossBatches}
}

// Forfeit takes a departing rank's work back: what it trained of the epoch
// since the last round that averaged its work (lost, which its model
// alone held), the part of each open plan no Batch report covers, then
// its undispatched partition; unfinished lists them all, in that order,
// neighbours joined. What the reports of its open plans cover is
// returned as trained (one Trained per open plan, in order), lost
// included: a caller counting figures adds the one and takes away the
// other. The rank is out of the cadence's timing and of the open window.
func (d *Dispatcher) Forfeit(rank uint32) (unfinished []Range, trained []Trained, lost []Span) {
	if d.cad != nil {
		d.cad.forget(rank)
	}
	if d.win != nil {
		delete(d.win.ranks, rank)
	}
	q := &d.queues[rank]
	lost = d.Held(rank)
	unfinished = Ranges(lost)
	q.unaveraged, q.published = nil, 0
	for _, p := range q.outstanding {
		trained = append(trained, p.trained())
		if u := p.unfinished(); u.Size > 0 {
			unfinished = append(unfinished, u)
		}
	}
	q.outstanding = nil
	q.sinceRound = 0
	if d.work != nil {
		unfinished = append(unfinished, d.work.forfeit(rank)...)
	}
	return joinRanges(unfinished), trained, lost
}

// TakeBack takes back the plan of epoch at [offset, +size) that rank's
// replaced trainer was training: it reports what the plan's Batch reports
// say was trained and the rest, which the rank sends no Metrics for.
// ok is false when the rank holds no such plan.
func (d *Dispatcher) TakeBack(rank uint32, epoch, offset, size uint64) (unfinished Range, trained Trained, ok bool) {
	q := &d.queues[rank]
	i := q.find(epoch, offset, size)
	if i < 0 {
		return Range{}, Trained{}, false
	}
	p := q.outstanding[i]
	q.outstanding = slices.Delete(q.outstanding, i, i+1)
	return p.unfinished(), p.trained(), true
}

// Extend hands the ranges to the survivors in equal consecutive shares,
// each piece one ExtendPartition (and one plan) of its own, and returns
// the pieces in the order their ExtendPartition frames must go out.
func (d *Dispatcher) Extend(rs []Range, survivors []uint32) []Handoff {
	total := sumRanges(rs)
	if total == 0 {
		return nil
	}
	var handed []Handoff
	shares := splitRanges(rs, equalSizes(total, len(survivors)))
	for i, id := range survivors {
		for _, rng := range shares[i] {
			q := &d.queues[id]
			q.outstanding = slices.Insert(q.outstanding, extSlot(q.outstanding), &Plan{epoch: d.epoch, rng: rng, ext: true})
			handed = append(handed, Handoff{Rank: id, Range: rng})
		}
	}
	d.log.Info("redistributed a lost rank's samples", "samples", total, "survivors", len(survivors))
	return handed
}

// extSlot is where an ExtendPartition runs among a rank's open plans: a
// worker runs it after the plan in progress (taken to be the first open
// one, unless the rank holds that one for a round) and after earlier
// extensions, ahead of chunks still queued or held. Batch reports name
// their plan; the order matters to ones that do not, which count against
// the first unfinished plan.
func extSlot(open []*Plan) int {
	at := 0
	if len(open) > 0 && !open[0].held {
		at = 1
	}
	for at < len(open) && open[at].ext {
		at++
	}
	return at
}
