package record

import "github.com/cohortdl/cohort/core/status"

// maxCurveBuckets bounds the points of curves.png's loss per round: far
// more than its panel has pixels across.
const maxCurveBuckets = 1024

// roundHistory is what the record keeps of the rounds, in memory that does
// not grow with the length of the run: the last status.MaxRounds rounds as
// they were, for the status snapshot, and the training loss of every round
// for curves.png, each point the mean over a bucket of rounds whose width
// doubles whenever the buckets would pass maxCurveBuckets (every round
// its own point until then).
type roundHistory struct {
	// recent ends with the latest rounds. Published snapshots share its
	// array, of twice MaxRounds, so it only appends, and moves its last
	// MaxRounds to a new array when it is full.
	recent []status.RoundPoint
	// buckets cover every round so far, in order; each but the last holds
	// width rounds.
	buckets []lossBucket
	width   uint64
}

// lossBucket is the n consecutive rounds first..last, and the sum and count
// of the losses reported for them.
type lossBucket struct {
	first, last uint64
	n           uint64
	lossSum     float64
	losses      uint64
}

func (h *roundHistory) add(p status.RoundPoint) {
	if h.width == 0 {
		// Both take their full size at the first round, so the record's
		// memory is what it will stay from the run's start (about 100 KB).
		h.recent = make([]status.RoundPoint, 0, 2*status.MaxRounds)
		h.buckets = make([]lossBucket, 0, maxCurveBuckets)
		h.width = 1
	}
	if len(h.recent) == cap(h.recent) {
		h.recent = append(make([]status.RoundPoint, 0, 2*status.MaxRounds), h.recent[len(h.recent)-status.MaxRounds:]...)
	}
	h.recent = append(h.recent, p)

	if n := len(h.buckets); n == 0 || h.buckets[n-1].n == h.width {
		if n == maxCurveBuckets {
			h.halve()
		}
		h.buckets = append(h.buckets, lossBucket{first: p.Round})
	}
	b := &h.buckets[len(h.buckets)-1]
	b.last = p.Round
	b.n++
	if p.Loss != nil {
		b.lossSum += *p.Loss
		b.losses++
	}
}

// halve merges the buckets in pairs, doubling their width.
func (h *roundHistory) halve() {
	out := h.buckets[:0]
	for i := 0; i+1 < len(h.buckets); i += 2 {
		a, b := h.buckets[i], h.buckets[i+1]
		out = append(out, lossBucket{first: a.first, last: b.last, n: a.n + b.n,
			lossSum: a.lossSum + b.lossSum, losses: a.losses + b.losses})
	}
	h.buckets = out
	h.width *= 2
}

// last is the latest status.MaxRounds rounds, for a snapshot: the caller
// may keep it, as nothing writes within its length.
func (h *roundHistory) last() []status.RoundPoint {
	r := h.recent[max(0, len(h.recent)-status.MaxRounds):]
	return r[:len(r):len(r)]
}

// curve is the run's loss per round for curves.png: a point a bucket, at
// its middle round, its loss the mean of the bucket's finite losses
// (none where no round of it had one).
func (h *roundHistory) curve() []status.RoundPoint {
	out := make([]status.RoundPoint, 0, len(h.buckets))
	for _, b := range h.buckets {
		p := status.RoundPoint{Round: b.first + (b.last-b.first)/2}
		if b.losses > 0 {
			l := b.lossSum / float64(b.losses)
			p.Loss = &l
		}
		out = append(out, p)
	}
	return out
}
