package dispatch

import "slices"

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
