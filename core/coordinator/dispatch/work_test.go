package dispatch

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

func TestEqualSizes(t *testing.T) {
	cases := []struct {
		total uint64
		n     int
		want  []uint64
	}{
		{10, 3, []uint64{4, 3, 3}},
		{9, 3, []uint64{3, 3, 3}},
		{2, 4, []uint64{1, 1, 0, 0}},
		{0, 2, []uint64{0, 0}},
		{5, 0, nil},
	}
	for _, tc := range cases {
		if got := equalSizes(tc.total, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("equalSizes(%d, %d) = %v, want %v", tc.total, tc.n, got, tc.want)
		}
	}
}

func TestSplitRanges(t *testing.T) {
	cases := []struct {
		name  string
		rs    []Range
		sizes []uint64
		want  [][]Range
	}{
		{"one range", []Range{{0, 10}}, []uint64{4, 3, 3},
			[][]Range{{{0, 4}}, {{4, 3}}, {{7, 3}}}},
		{"a piece crosses a gap", []Range{{10, 3}, {50, 5}}, []uint64{4, 4},
			[][]Range{{{10, 3}, {50, 1}}, {{51, 4}}}},
		{"zero-size share", []Range{{0, 1}}, []uint64{1, 0},
			[][]Range{{{0, 1}}, nil}},
		{"sizes short of the ranges", []Range{{0, 10}}, []uint64{2},
			[][]Range{{{0, 2}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := splitRanges(tc.rs, tc.sizes)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if !slices.Equal(got[i], tc.want[i]) {
					t.Errorf("piece %d: %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestTakeFront(t *testing.T) {
	q := []Range{{0, 5}, {20, 10}}
	c, rest := takeFront(q, 3)
	if c != (Range{0, 3}) || !slices.Equal(rest, []Range{{3, 2}, {20, 10}}) {
		t.Fatalf("take 3: %v, rest %v", c, rest)
	}
	if q[0] != (Range{0, 5}) {
		t.Fatal("takeFront changed its input")
	}
	// A chunk never spans two ranges: it is one plan.
	c, rest = takeFront(rest, 100)
	if c != (Range{3, 2}) || !slices.Equal(rest, []Range{{20, 10}}) {
		t.Fatalf("take past a boundary: %v, rest %v", c, rest)
	}
	if c, _ := takeFront(nil, 4); c.Size != 0 {
		t.Fatalf("take from empty: %v", c)
	}
	if c, _ := takeFront([]Range{{0, 0}, {7, 2}}, 1); c != (Range{7, 1}) {
		t.Fatalf("empty head not skipped: %v", c)
	}
}

func TestEpochWorkPartitionsCoverTheEpoch(t *testing.T) {
	w := newEpochWork(0, 10, []uint32{0, 2, 5}, false)
	want := map[uint32][]Range{0: {{0, 4}}, 2: {{4, 3}}, 5: {{7, 3}}}
	for r, rs := range want {
		if !slices.Equal(w.parts[r], rs) {
			t.Errorf("rank %d partition %v, want %v", r, w.parts[r], rs)
		}
	}
	if c := w.take(2, 2); c != (Range{4, 2}) || w.remaining() != 8 {
		t.Errorf("take: %v, remaining %d", c, w.remaining())
	}
	if rs := w.forfeit(5); !slices.Equal(rs, []Range{{7, 3}}) || w.remaining() != 5 {
		t.Errorf("forfeit: %v, remaining %d", rs, w.remaining())
	}
	shared := newEpochWork(0, 10, []uint32{0, 1}, true)
	a, b := shared.take(0, 6), shared.take(1, 6)
	if a != (Range{0, 6}) || b != (Range{6, 4}) || shared.remaining() != 0 {
		t.Errorf("pool takes %v %v, remaining %d", a, b, shared.remaining())
	}
}

func TestPlanUnfinished(t *testing.T) {
	cases := []struct {
		reported uint64
		want     Range
	}{
		{0, Range{100, 24}},
		{8, Range{108, 16}},
		{24, Range{124, 0}},
		{1 << 40, Range{124, 0}}, // a rank may report anything
	}
	for _, tc := range cases {
		p := &Plan{rng: Range{100, 24}, reported: tc.reported}
		if got := p.unfinished(); got != tc.want {
			t.Errorf("reported %d: %v, want %v", tc.reported, got, tc.want)
		}
	}
}

func TestCheckRanges(t *testing.T) {
	cases := []struct {
		rs   []Range
		bad  string
		pick uint64
	}{
		{[]Range{{0, 5}, {5, 5}}, "", 10},
		{[]Range{{5, 5}, {0, 6}}, "overlaps", 10},
		{[]Range{{8, 5}}, "does not fit", 10},
		{[]Range{{math.MaxUint64, 2}}, "does not fit", 10},
	}
	for _, tc := range cases {
		err := CheckRanges(tc.rs, tc.pick)
		if (tc.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("CheckRanges(%v) = %v, want %q", tc.rs, err, tc.bad)
		}
	}
}

func TestScaleCounts(t *testing.T) {
	cases := []struct {
		counts []uint64
		total  uint64
		want   []uint64
	}{
		{[]uint64{16, 4}, 100, []uint64{16, 4}},
		{[]uint64{16, 4}, 10, []uint64{8, 2}},
		{[]uint64{16, 4}, 7, []uint64{6, 1}},
		{[]uint64{3, 3, 3}, 2, []uint64{1, 1, 0}},
		{[]uint64{5}, 0, []uint64{0}},
	}
	for _, tc := range cases {
		if got := scaleCounts(tc.counts, tc.total); !slices.Equal(got, tc.want) {
			t.Errorf("scaleCounts(%v, %d) = %v, want %v", tc.counts, tc.total, got, tc.want)
		}
	}
}

func TestCadencePlan(t *testing.T) {
	cases := []struct {
		name string
		ms   map[uint32]float64
		want map[uint32]uint64
	}{
		{"probe: no timing yet", nil, map[uint32]uint64{0: 4, 1: 4, 2: 4}},
		{"anchor is the slowest", map[uint32]float64{0: 2, 1: 8, 2: 4}, map[uint32]uint64{0: 16, 1: 4, 2: 8}},
		{"speed ratio capped", map[uint32]float64{0: 0.001, 1: 10, 2: 10}, map[uint32]uint64{0: 256, 1: 4, 2: 4}},
		{"a rank without timing gets base", map[uint32]float64{0: 2, 1: 8}, map[uint32]uint64{0: 16, 1: 4, 2: 4}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCadence(4, 1000, 0.1)
			for r, ms := range tc.ms {
				c.observe(r, ms)
			}
			got := c.plan([]uint32{0, 1, 2})
			for r, w := range tc.want {
				if got[r] != w {
					t.Errorf("rank %d: %d batches, want %d (all: %v)", r, got[r], w, got)
				}
			}
		})
	}
}

func TestCadenceIgnoresBadTimesAndKeepsCountsInDeadZone(t *testing.T) {
	c := newCadence(10, 1000, 0.1)
	for _, v := range []float64{math.NaN(), math.Inf(1), -3, 0} {
		c.observe(0, v)
	}
	if ms := c.ms(0); ms != 0 {
		t.Fatalf("a bad batch time was recorded: %v", ms)
	}
	c.observe(0, 5)
	c.observe(1, 10)
	first := c.plan([]uint32{0, 1})
	c.observe(0, 5.1) // within 5 %: the count holds
	second := c.plan([]uint32{0, 1})
	if first[0] != 20 || second[0] != 20 {
		t.Errorf("counts %v then %v, want 20 both times", first, second)
	}
	c.forget(1)
	if got := c.plan([]uint32{0}); got[0] != 10 {
		t.Errorf("a lone rank is its own anchor: %v", got)
	}
}

func TestCadenceWindowGrowth(t *testing.T) {
	cases := []struct {
		name             string
		base, max        uint64
		roundMS, windowM float64
		want             uint64
	}{
		{"under target", 4, 100, 5, 100, 4},
		{"over target grows proportionally", 4, 100, 15, 100, 6},
		{"growth capped at 2x", 4, 100, 90, 100, 8},
		{"capped at the epoch", 4, 5, 90, 100, 5},
		{"nonsense window ignored", 4, 100, 10, 0, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCadence(tc.base, tc.max, 0.1)
			c.calibrations = stableAfter
			c.observeWindow(tc.roundMS, tc.windowM, verdictGrow)
			if c.base != tc.want {
				t.Errorf("base %d, want %d", c.base, tc.want)
			}
		})
	}
}

func TestExtSlotFollowsTheWorkersOrder(t *testing.T) {
	reg := func() *Plan { return &Plan{} }
	ext := func() *Plan { return &Plan{ext: true} }
	cases := []struct {
		name string
		open []*Plan
		want int
	}{
		{"nothing open", nil, 0},
		{"after the plan in progress", []*Plan{reg()}, 1},
		{"after earlier extensions, ahead of a queued chunk", []*Plan{ext(), ext(), reg()}, 2},
		{"behind the running chunk and its extension", []*Plan{reg(), ext(), reg()}, 2},
	}
	for _, tc := range cases {
		if got := extSlot(tc.open); got != tc.want {
			t.Errorf("%s: slot %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A Batch counts against the plan it names, whatever the order of the
// rank's open plans; one that names none counts against the first plan the
// rank has not finished and does not hold.
func TestReportedPlan(t *testing.T) {
	window := &Plan{epoch: 1, rng: Range{Offset: 0, Size: 16}}
	ext := &Plan{epoch: 1, rng: Range{Offset: 40, Size: 8}, ext: true}
	held := &Plan{epoch: 1, rng: Range{Offset: 16, Size: 16}, held: true}
	for _, tc := range []struct {
		name string
		open []*Plan
		m    *wirepb.Batch
		want *Plan
	}{
		{"named", []*Plan{window, ext}, &wirepb.Batch{Epoch: 1, PartitionOffset: 40, PartitionSize: 8}, ext},
		{"named, held first", []*Plan{held, ext}, &wirepb.Batch{Epoch: 1, PartitionOffset: 40, PartitionSize: 8}, ext},
		{"named, other epoch", []*Plan{window, ext}, &wirepb.Batch{Epoch: 2, PartitionOffset: 40, PartitionSize: 8}, nil},
		{"named, no such plan", []*Plan{window}, &wirepb.Batch{Epoch: 1, PartitionOffset: 8, PartitionSize: 8}, nil},
		{"anonymous", []*Plan{window, ext}, &wirepb.Batch{Epoch: 1}, window},
		{"anonymous, held first", []*Plan{held, ext}, &wirepb.Batch{Epoch: 1}, ext},
		{"anonymous, none open", nil, &wirepb.Batch{Epoch: 1}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &queue{outstanding: tc.open}
			if got := q.reportedPlan(tc.m); got != tc.want {
				t.Errorf("counted against %+v, want %+v", got, tc.want)
			}
		})
	}
}
