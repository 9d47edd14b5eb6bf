package dispatch

import (
	"fmt"
	"slices"
)

// Range is a contiguous slice [Offset, Offset+Size) of an epoch's shared
// permutation.
type Range struct {
	Offset uint64 `json:"offset"`
	Size   uint64 `json:"size"`
}

func (r Range) end() uint64 { return r.Offset + r.Size }

// sumRanges is the number of samples in rs.
func sumRanges(rs []Range) uint64 {
	var n uint64
	for _, r := range rs {
		n += r.Size
	}
	return n
}

// equalSizes splits total into n sizes that differ by at most one, the
// first total%n one larger (the protocol's partition rule).
func equalSizes(total uint64, n int) []uint64 {
	if n <= 0 {
		return nil
	}
	sizes := make([]uint64, n)
	base, extra := total/uint64(n), total%uint64(n)
	for i := range sizes {
		sizes[i] = base
		if uint64(i) < extra {
			sizes[i]++
		}
	}
	return sizes
}

// splitRanges cuts the concatenation of rs, in order, into consecutive
// pieces of the given sizes. A piece that crosses a boundary of rs is made
// of several ranges, so piece i is a list. The sizes must not sum to more
// than rs holds.
func splitRanges(rs []Range, sizes []uint64) [][]Range {
	out := make([][]Range, len(sizes))
	i, used := 0, uint64(0) // rs[i] has used samples taken
	for p, want := range sizes {
		for want > 0 && i < len(rs) {
			take := min(want, rs[i].Size-used)
			if take > 0 {
				out[p] = append(out[p], Range{Offset: rs[i].Offset + used, Size: take})
			}
			used += take
			want -= take
			if used == rs[i].Size {
				i, used = i+1, 0
			}
		}
	}
	return out
}

// takeFront takes up to n samples from the front of q as one contiguous
// range: never more than q's first range holds, so a chunk is always one
// plan. It returns the chunk (Size 0 when q is empty or n is 0) and the
// rest of q.
func takeFront(q []Range, n uint64) (Range, []Range) {
	for len(q) > 0 && q[0].Size == 0 {
		q = q[1:]
	}
	if len(q) == 0 || n == 0 {
		return Range{}, q
	}
	head := q[0]
	if n >= head.Size {
		return head, q[1:]
	}
	rest := slices.Clone(q)
	rest[0] = Range{Offset: head.Offset + n, Size: head.Size - n}
	return Range{Offset: head.Offset, Size: n}, rest
}

// CheckRanges refuses ranges that leave [0, pickSpace) or overlap, so a
// resumed run never dispatches a sample twice or past the data.
func CheckRanges(rs []Range, pickSpace uint64) error {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b Range) int {
		switch {
		case a.Offset < b.Offset:
			return -1
		case a.Offset > b.Offset:
			return 1
		}
		return 0
	})
	var prevEnd uint64
	for i, r := range sorted {
		if r.end() < r.Offset || r.end() > pickSpace {
			return fmt.Errorf("range [%d, +%d) does not fit a pick space of %d", r.Offset, r.Size, pickSpace)
		}
		if i > 0 && r.Offset < prevEnd {
			return fmt.Errorf("range [%d, +%d) overlaps the one before it", r.Offset, r.Size)
		}
		prevEnd = r.end()
	}
	return nil
}

// epochWork is what is left to dispatch of one epoch: per-rank partitions
// (policy sync: each rank works through its own contiguous share) and a
// shared pool (cadence and async: a faster rank simply draws more).
type epochWork struct {
	epoch uint64
	parts map[uint32][]Range
	pool  []Range
}

// newEpochWork splits the whole epoch [0, pickSpace) for the live ranks:
// equal contiguous partitions when shared is false, one pool otherwise.
func newEpochWork(epoch, pickSpace uint64, live []uint32, shared bool) *epochWork {
	w := &epochWork{epoch: epoch, parts: map[uint32][]Range{}}
	all := []Range{{Offset: 0, Size: pickSpace}}
	if shared {
		w.pool = all
		return w
	}
	for i, rs := range splitRanges(all, equalSizes(pickSpace, len(live))) {
		w.parts[live[i]] = rs
	}
	return w
}

// remaining is the number of samples not yet dispatched.
func (w *epochWork) remaining() uint64 {
	n := sumRanges(w.pool)
	for _, rs := range w.parts {
		n += sumRanges(rs)
	}
	return n
}

// take draws rank's next chunk of up to n samples: from its own partition
// first, then from the pool.
func (w *epochWork) take(rank uint32, n uint64) Range {
	if q := w.parts[rank]; sumRanges(q) > 0 {
		var c Range
		c, w.parts[rank] = takeFront(q, n)
		return c
	}
	var c Range
	c, w.pool = takeFront(w.pool, n)
	return c
}

// hasOwn reports whether rank still has undispatched samples of its own
// partition.
func (w *epochWork) hasOwn(rank uint32) bool { return sumRanges(w.parts[rank]) > 0 }

// forfeit removes and returns rank's undispatched partition.
func (w *epochWork) forfeit(rank uint32) []Range {
	rs := w.parts[rank]
	delete(w.parts, rank)
	return rs
}

// RankRanges is one rank's share of the samples left in an epoch.
type RankRanges struct {
	Rank   uint32  `json:"rank"`
	Ranges []Range `json:"ranges"`
}

// Handoff is a range extended to a survivor.
type Handoff struct {
	Rank uint32 `json:"rank"`
	Range
}

// Plan is one dispatched slice (a chunk or an ExtendPartition) that a rank
// has not closed with Metrics yet.
type Plan struct {
	epoch    uint64
	rng      Range
	reported uint64 // samples of it that Batch reports say are trained
	// The reported batches and their loss (sum, and the batches it
	// covers), counted in the epoch's figures should the rank leave before
	// its Metrics closes the plan.
	reportedBatches uint64
	lossSum         float64
	lossBatches     uint64
	ext             bool // sent as ExtendPartition
	// held: it came with a Sync, and the rank holds it until its round
	// succeeds (its SyncAck says so); until then it trains none of it.
	held bool
	// reportMS lets the rank merge the plan's Batch reports (solo only).
	reportMS uint32
	// lrScale is the controller's learning-rate scale for the plan.
	lrScale float64
}

// unfinished is the part of p that no Batch report covers: batches run in
// order over the plan's slice, so the trained samples are its prefix.
func (p *Plan) unfinished() Range {
	done := min(p.reported, p.rng.Size)
	return Range{Offset: p.rng.Offset + done, Size: p.rng.Size - done}
}
