package dispatch

import (
	"slices"

	"github.com/cohortdl/cohort/core/config"
)

// What a rank trains reaches the cohort's model only through a round that
// averages it: until then the rank's own model alone holds it, and dies
// with it. Each queue lists those samples in report order (unaveraged)
// and how many of its spans the rank published into the averaging round
// in flight (published: everything at the round's issue, then what its
// SnapshotReady says). A completed round moves the published spans into
// the consensus; a departing rank's spans are handed out again; a save's
// root rank's spans are what its saved model holds beyond the consensus.

// Span is a slice of an epoch that a rank's Batch reports say it trained,
// in that many batches.
type Span struct {
	Epoch uint64 `json:"epoch"`
	Range
	Batches uint64 `json:"batches"`
}

// noteTrained records that a Batch report covered n more samples of p,
// from its from-th, in batches.
func (q *queue) noteTrained(p *Plan, from, n, batches uint64) {
	if n == 0 {
		return
	}
	at := p.rng.Offset + from
	if k := len(q.unaveraged); k > q.published {
		if last := &q.unaveraged[k-1]; last.Epoch == p.epoch && last.end() == at {
			last.Size += n
			last.Batches += batches
			return
		}
	}
	q.unaveraged = append(q.unaveraged, Span{Epoch: p.epoch, Range: Range{Offset: at, Size: n}, Batches: batches})
}

// Published notes rank's SnapshotReady for the averaging round in flight:
// the round averages what it reported before it, not what it trains
// while the round runs.
func (d *Dispatcher) Published(rank uint32) {
	q := &d.queues[rank]
	q.published = len(q.unaveraged)
}

// Consensus notes a completed round: the live ranks' models all hold what
// each published into it (or into the round it re-ran as a broadcast).
func (d *Dispatcher) Consensus(live []uint32) {
	for _, id := range live {
		q := &d.queues[id]
		q.unaveraged = slices.Clone(q.unaveraged[q.published:])
		q.published = 0
	}
}

// Held is what rank trained of the current epoch beyond the consensus:
// what its model holds that no other does.
func (d *Dispatcher) Held(rank uint32) []Span {
	var out []Span
	for _, s := range d.queues[rank].unaveraged {
		if s.Epoch == d.epoch {
			out = append(out, s)
		}
	}
	return out
}

// Ranges are the spans' ranges.
func Ranges(spans []Span) []Range {
	out := make([]Range, len(spans))
	for i, s := range spans {
		out[i] = s.Range
	}
	return out
}

// joinRanges merges neighbours that continue one another.
func joinRanges(rs []Range) []Range {
	var out []Range
	for _, r := range rs {
		if r.Size == 0 {
			continue
		}
		if k := len(out); k > 0 && out[k-1].end() == r.Offset {
			out[k-1].Size += r.Size
			continue
		}
		out = append(out, r)
	}
	return out
}

// without is rs less every sample of cut.
func without(rs, cut []Range) []Range {
	for _, c := range cut {
		var next []Range
		for _, r := range rs {
			lo, hi := max(r.Offset, c.Offset), min(r.end(), c.end())
			if lo >= hi {
				next = append(next, r)
				continue
			}
			if r.Offset < lo {
				next = append(next, Range{Offset: r.Offset, Size: lo - r.Offset})
			}
			if hi < r.end() {
				next = append(next, Range{Offset: hi, Size: r.end() - hi})
			}
		}
		rs = next
	}
	return rs
}

// Without is s less the samples of held: what is left of the epoch once a
// model holds them too.
func (s Snapshot) Without(held []Range) Snapshot {
	out := s
	out.Remaining = make(map[uint32][]Range, len(s.Remaining))
	for id, rs := range s.Remaining {
		out.Remaining[id] = without(rs, held)
	}
	out.Pool = without(s.Pool, held)
	return out
}

// ContinueWindow takes back the window a lost coordinator handed out
// after the consensus the dispatcher was resumed from: held is what each
// live rank kept of it (its spans since that consensus). It hands the
// window again, as the lost coordinator did, less what each rank trained
// already: that is the rank's unaveraged work, which the window's round
// averages as if its reports had come. The plans returned are the rest of
// each rank's window (none for a rank that trained all of it). ok is
// false, and nothing changed, unless the policy partitions the epoch and
// each rank's held work is exactly the start of its plan in this window:
// then only a round can take it in.
func (d *Dispatcher) ContinueWindow(live []uint32, held map[uint32][]Span) (plans map[uint32]*Plan, ok bool) {
	if d.policy != config.PolicySync || d.work == nil {
		return nil, false
	}
	want := d.ctl.window().Interval * d.batch
	done := map[uint32]uint64{}
	for _, id := range live {
		if len(d.queues[id].outstanding) > 0 || len(d.queues[id].unaveraged) > 0 {
			return nil, false
		}
		var rs []Range
		for _, s := range held[id] {
			if s.Epoch != d.epoch {
				return nil, false
			}
			rs = append(rs, s.Range)
		}
		rs = joinRanges(rs)
		if len(rs) == 0 {
			continue
		}
		// takeFront leaves the partition as it is: this only looks.
		c, _ := takeFront(d.work.parts[id], want)
		if len(rs) > 1 || rs[0].Offset != c.Offset || rs[0].Size > c.Size {
			return nil, false
		}
		done[id] = rs[0].Size
	}
	plans = d.WindowPlans(live, false)
	for id, n := range done {
		q := &d.queues[id]
		p := plans[id]
		p.rng = Range{Offset: p.rng.Offset + n, Size: p.rng.Size - n}
		if p.rng.Size == 0 {
			q.outstanding = slices.DeleteFunc(q.outstanding, func(o *Plan) bool { return o == p })
			delete(plans, id)
			delete(d.win.ranks, id)
		}
		for _, s := range held[id] {
			q.unaveraged = append(q.unaveraged, s)
			q.sinceRound += s.Batches
			d.batches += s.Batches
		}
	}
	return plans, true
}
