package dispatch

import (
	"slices"
	"testing"

	"github.com/cohortdl/cohort/core/config"
)

// A rank's batch time is the mean of its last five readings: an old
// outlier ages out.
func TestCadenceTrustWindow(t *testing.T) {
	c := newCadence(4, 100, 0.1)
	for _, v := range []float64{100, 10, 10, 10, 10} {
		c.observe(0, v)
	}
	if got := c.ms(0); got != 28 {
		t.Errorf("mean of 100 and four 10s: %g, want 28", got)
	}
	c.observe(0, 10)
	if got := c.ms(0); got != 10 {
		t.Errorf("after a sixth reading the 100 is out: %g, want 10", got)
	}
}

// The anchor is elected among the ranks within 15% of the slowest and kept
// until a cohort member is 10% slower than it.
func TestCadenceAnchorHysteresis(t *testing.T) {
	time := func(c *cadence, ms map[uint32]float64) {
		for r, v := range ms {
			for range trustWindow {
				c.observe(r, v)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		first map[uint32]float64
		then  map[uint32]float64
		want  uint32
	}{
		{"the slowest is elected", map[uint32]float64{0: 5, 1: 10, 2: 6}, nil, 1},
		{"a 5% slower rank does not take it",
			map[uint32]float64{0: 5, 1: 10, 2: 6}, map[uint32]float64{2: 10.5}, 1},
		{"a 20% slower rank does",
			map[uint32]float64{0: 5, 1: 10, 2: 6}, map[uint32]float64{2: 12}, 2},
		{"an anchor that sped out of the cohort loses it",
			map[uint32]float64{0: 5, 1: 10, 2: 9.5}, map[uint32]float64{1: 5}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCadence(4, 100, 0.1)
			live := []uint32{0, 1, 2}
			time(c, tc.first)
			c.plan(live)
			if tc.then != nil {
				time(c, tc.then)
				c.plan(live)
			}
			if c.anchor != int64(tc.want) {
				t.Errorf("anchor %d, want %d", c.anchor, tc.want)
			}
		})
	}
}

// max_batch_diff bounds how far a rank's count moves in one window.
func TestCadenceMaxBatchDiff(t *testing.T) {
	c := newCadence(4, 1000, 0.1)
	c.maxDiff = 3
	live := []uint32{0, 1}
	c.observe(0, 10)
	c.observe(1, 10)
	c.plan(live) // both 4
	for range trustWindow {
		c.observe(0, 1) // rank 0 is now 10× faster: it wants 40
	}
	var got []uint64
	for range 3 {
		got = append(got, c.plan(live)[0])
	}
	if !slices.Equal(got, []uint64{7, 10, 13}) {
		t.Errorf("rank 0's counts %v, want 7, 10, 13: three more per window", got)
	}
}

// The window grows only once calibrated: never while probing, at twice the
// overhead target while warming up, at the target once stable.
func TestCadenceGrowthByPhase(t *testing.T) {
	for _, tc := range []struct {
		calibrations int
		overhead     float64
		grows        bool
	}{
		{0, 0.5, false},
		{1, 0.15, false},
		{1, 0.25, true},
		{stableAfter, 0.15, true},
		{matureAfter, 0.05, false},
	} {
		c := newCadence(4, 100, 0.1)
		c.calibrations = tc.calibrations
		if _, got := c.observeWindow(tc.overhead*100, 100, verdictGrow); got != tc.grows {
			t.Errorf("phase %s, overhead %g: grew %v, want %v", c.phase(), tc.overhead, got, tc.grows)
		}
	}
}

// The last window of an epoch takes the whole remainder: crumbs go to the
// ranks they lengthen least, a shortfall scales down, and no rank is left
// with a lone batch another working rank could take.
func TestFinalWindow(t *testing.T) {
	for _, tc := range []struct {
		name      string
		counts    []uint64
		remaining uint64
		want      []uint64
	}{
		{"not the last window", []uint64{8, 4, 4}, 19, []uint64{8, 4, 4}},
		{"exactly one window left", []uint64{8, 4, 4}, 16, []uint64{8, 4, 4}},
		{"crumbs go to the fastest first", []uint64{8, 4, 4}, 17, []uint64{9, 4, 4}},
		{"two crumbs: a tie goes to the lower rank", []uint64{8, 4, 4}, 18, []uint64{10, 4, 4}},
		{"a shortfall scales every rank", []uint64{8, 4, 4}, 8, []uint64{4, 2, 2}},
		{"a lone batch moves to a working peer", []uint64{16, 4}, 7, []uint64{7, 0}},
		{"equal ranks keep lone batches only when nobody else works", []uint64{4, 4, 4}, 1, []uint64{1, 0, 0}},
		{"two lone batches consolidate", []uint64{4, 4, 4}, 2, []uint64{0, 2, 0}},
		{"nothing left", []uint64{4, 4}, 0, []uint64{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := finalWindow(tc.counts, tc.remaining)
			if !slices.Equal(got, tc.want) {
				t.Errorf("finalWindow(%v, %d) = %v, want %v", tc.counts, tc.remaining, got, tc.want)
			}
			var sum uint64
			for _, n := range got {
				sum += n
			}
			var planned uint64
			for _, n := range tc.counts {
				planned += n
			}
			if last := tc.remaining < planned+uint64(len(tc.counts)); last && sum != tc.remaining {
				t.Errorf("allocated %d of %d batches", sum, tc.remaining)
			}
		})
	}
}

// The controller's verdict bounds the window: growth for overhead only
// while ranks stay within the divergence target, a halving (at most every
// third window, down to the floor) when they drift well past it.
func TestCadenceVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verdicts []verdict
		want     []uint64 // the base after each window
	}{
		{"growth allowed", []verdict{verdictGrow, verdictGrow}, []uint64{16, 32}},
		{"growth held", []verdict{verdictHold, verdictHold}, []uint64{8, 8}},
		{"drift halves it, with a cooldown",
			[]verdict{verdictGrow, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink},
			[]uint64{16, 8, 8, 8, 4, 4, 4}},
		{"down to the floor", []verdict{verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink, verdictShrink},
			[]uint64{4, 4, 4, 2, 2, 2, 2, 2, 2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCadence(8, 1000, 0.05)
			c.minBase = 2
			c.sinceShrink = cooldownRounds
			c.calibrations = stableAfter
			var got []uint64
			for _, v := range tc.verdicts {
				c.observeWindow(50, 100, v) // overhead 50%: growth wanted
				got = append(got, c.base)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("bases %v, want %v", got, tc.want)
			}
		})
	}
}

// The verdict follows the divergence's running mean against the target.
func TestControllerVerdict(t *testing.T) {
	for _, tc := range []struct {
		name  string
		adapt bool
		divs  []float64
		want  verdict
	}{
		{"no divergence reported", true, nil, verdictGrow},
		{"well inside", true, repeat(0.01, 3), verdictGrow},
		{"above target", true, repeat(0.06, 3), verdictHold},
		{"well past it", true, repeat(0.2, 3), verdictShrink},
		{"adaptation off", false, repeat(0.2, 3), verdictGrow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newController(ctlConfig(func(co *config.Coordinator) { co.AdaptiveSync = tc.adapt }), nil)
			for i, d := range tc.divs {
				c.observeRound(uint64(i+1), 1, []float64{d})
			}
			if got := c.verdict(); got != tc.want {
				t.Errorf("verdict %d, want %d", got, tc.want)
			}
		})
	}
}
