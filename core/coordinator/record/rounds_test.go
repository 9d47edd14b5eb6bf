package record

import (
	"slices"
	"testing"

	"github.com/cohortdl/cohort/core/status"
)

func roundAt(i uint64, loss bool) status.RoundPoint {
	p := status.RoundPoint{Round: i, Epoch: i / 24, Seconds: float64(i)}
	if loss {
		l := float64(i)
		p.Loss = &l
	}
	return p
}

// Up to maxCurveBuckets rounds, the curve is every round's own loss, and
// a round without one stays without one.
func TestRoundCurveExactWhileShort(t *testing.T) {
	var h roundHistory
	for i := uint64(1); i <= maxCurveBuckets; i++ {
		h.add(roundAt(i, i != 5))
	}
	c := h.curve()
	if len(c) != maxCurveBuckets {
		t.Fatalf("%d points for %d rounds", len(c), maxCurveBuckets)
	}
	for i, p := range c {
		r := uint64(i + 1)
		switch {
		case p.Round != r:
			t.Fatalf("point %d is round %d, want %d", i, p.Round, r)
		case r == 5 && p.Loss != nil:
			t.Fatalf("round 5 had no loss, its point has %v", *p.Loss)
		case r != 5 && (p.Loss == nil || *p.Loss != float64(r)):
			t.Fatalf("round %d: loss %v, want %v", r, p.Loss, r)
		}
	}
}

// However many rounds, the curve keeps at most maxCurveBuckets points,
// they cover every round once, in order, and each point is the mean loss
// of its rounds, drawn at its middle: a loss that rises by one a round
// reads as its round number.
func TestRoundCurveBoundedAndExactOnAverage(t *testing.T) {
	var h roundHistory
	const rounds = 10*maxCurveBuckets + 7
	for i := uint64(1); i <= rounds; i++ {
		h.add(roundAt(i, true))
	}
	if len(h.buckets) > maxCurveBuckets {
		t.Fatalf("%d buckets, limit %d", len(h.buckets), maxCurveBuckets)
	}
	next, total := uint64(1), 0.0
	for i, b := range h.buckets {
		if b.first != next || b.last < b.first || b.n != b.last-b.first+1 || b.losses != b.n {
			t.Fatalf("bucket %d %+v; want one starting at round %d", i, b, next)
		}
		if i < len(h.buckets)-1 && b.n != h.width {
			t.Fatalf("bucket %d holds %d rounds, width %d", i, b.n, h.width)
		}
		next = b.last + 1
		total += b.lossSum
	}
	if next != rounds+1 || total != float64(rounds)*(rounds+1)/2 {
		t.Fatalf("buckets end before round %d with loss sum %v; want %d rounds summing to %v", next, total, rounds, float64(rounds)*(rounds+1)/2)
	}
	for _, p := range h.curve() {
		b, _ := slices.BinarySearchFunc(h.buckets, p.Round, func(b lossBucket, r uint64) int {
			if b.last < r {
				return -1
			}
			if b.first > r {
				return 1
			}
			return 0
		})
		mid := float64(h.buckets[b].first+h.buckets[b].last) / 2
		if p.Loss == nil || *p.Loss != mid || float64(p.Round) < mid-0.5 || float64(p.Round) > mid {
			t.Fatalf("point at round %d with loss %v; want the mean %v at the bucket's middle", p.Round, p.Loss, mid)
		}
	}
}

// A snapshot's rounds are the last MaxRounds, and later rounds never
// change a snapshot already published; the memory kept stays within two
// snapshots' worth.
func TestRecentRoundsShareSafely(t *testing.T) {
	var h roundHistory
	var snaps [][]status.RoundPoint
	var copies [][]status.RoundPoint
	for i := uint64(1); i <= 5*status.MaxRounds+3; i++ {
		h.add(roundAt(i, true))
		if i%97 == 0 {
			s := h.last()
			snaps, copies = append(snaps, s), append(copies, slices.Clone(s))
			if len(s) != int(min(i, status.MaxRounds)) || s[len(s)-1].Round != i {
				t.Fatalf("after round %d a snapshot holds %d rounds ending at %d", i, len(s), s[len(s)-1].Round)
			}
			// A snapshot's slice cannot be appended into the history's array.
			if cap(s) != len(s) {
				t.Fatalf("snapshot of %d rounds has capacity %d", len(s), cap(s))
			}
		}
		if cap(h.recent) > 2*status.MaxRounds {
			t.Fatalf("after round %d the history holds an array of %d rounds", i, cap(h.recent))
		}
	}
	for i := range snaps {
		if !slices.EqualFunc(snaps[i], copies[i], func(a, b status.RoundPoint) bool { return a.Round == b.Round && *a.Loss == *b.Loss }) {
			t.Fatalf("snapshot %d changed after it was published", i)
		}
	}
}
