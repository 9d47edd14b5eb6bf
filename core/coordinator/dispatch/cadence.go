package dispatch

import (
	"math"
	"slices"
)

// Cadence tuning (ElChe): a rank's batch time is the mean of its last
// trustWindow readings; the anchor (the rank whose window sets the pace) is
// elected among the ranks within anchorCohort of the slowest and kept until
// a cohort member is anchorDominance slower, so near-equal ranks do not
// trade it every window; the most batches a fast rank gets per anchor
// batch; the relative change below which a rank's count is left alone (so
// jitter does not reshuffle work every window); the most the window grows
// in one step. The window grows only once calibrated: from stableAfter
// calibrations at the overhead target, before that (warm-up) at twice it.
const (
	trustWindow     = 5
	anchorCohort    = 0.15
	anchorDominance = 0.10
	cadenceMaxRatio = 64
	cadenceDeadZone = 0.05
	cadenceMaxGrow  = 2.0
	stableAfter     = 5
	matureAfter     = 20
)

// Cadence phases, by calibrations (windows planned with every live rank
// timed).
const (
	phaseProbe  = "probe"
	phaseWarmup = "warmup"
	phaseStable = "stable"
	phaseMature = "mature"
)

// cadence sizes the windows of the cadence policy. The anchor gets base
// batches per window; every other rank gets as many as it can train in the
// anchor's time, so all of them reach the sync together. When a round
// costs more than target of the window's compute time the window grows, so
// averaging overhead stays bounded.
type cadence struct {
	base    uint64
	minBase uint64 // the floor of a shrink (coordinator.sync_every_min)
	maxBase uint64
	// sinceShrink counts windows since the last shrink.
	sinceShrink int
	target      float64
	// maxDiff, when not 0, bounds how far one window's count of a rank may
	// move from its last (coordinator.max_batch_diff).
	maxDiff      uint64
	trust        map[uint32]*trust // each rank's recent batch times
	counts       map[uint32]uint64 // the counts last handed out
	anchor       int64             // the elected anchor; -1: none yet
	calibrations int
}

// trust is a rank's last trustWindow batch times.
type trust struct {
	vals [trustWindow]float64
	n    int // readings held, up to trustWindow
	next int
}

func (t *trust) add(v float64) {
	t.vals[t.next] = v
	t.next = (t.next + 1) % trustWindow
	t.n = min(t.n+1, trustWindow)
}

func (t *trust) mean() float64 {
	var s float64
	for _, v := range t.vals[:t.n] {
		s += v
	}
	return s / float64(t.n)
}

// CadenceState is the cadence controller's state in a checkpoint, so a
// resumed run starts calibrated.
type CadenceState struct {
	Base         uint64             `json:"base"`
	MSPerBatch   map[uint32]float64 `json:"ms_per_batch,omitempty"`
	Anchor       *uint32            `json:"anchor,omitempty"`
	Calibrations int                `json:"calibrations,omitempty"`
}

func newCadence(base, maxBase uint64, target float64) *cadence {
	base = max(base, 1)
	return &cadence{
		base:    min(base, max(maxBase, 1)),
		minBase: 1,
		maxBase: max(maxBase, 1),
		target:  target,
		trust:   map[uint32]*trust{},
		counts:  map[uint32]uint64{},
		anchor:  -1,
	}
}

// observe adds one batch time of rank to its trust window. Values that
// are not a finite positive time (a rank may send anything) are ignored.
func (c *cadence) observe(rank uint32, batchMS float64) {
	if !(batchMS > 0) || math.IsInf(batchMS, 0) {
		return
	}
	t := c.trust[rank]
	if t == nil {
		t = &trust{}
		c.trust[rank] = t
	}
	t.add(batchMS)
}

// ms is rank's smoothed batch time, or 0 before its first reading.
func (c *cadence) ms(rank uint32) float64 {
	if t := c.trust[rank]; t != nil && t.n > 0 {
		return t.mean()
	}
	return 0
}

// forget drops a dead rank, so it can no longer be the anchor.
func (c *cadence) forget(rank uint32) {
	delete(c.trust, rank)
	delete(c.counts, rank)
	if c.anchor == int64(rank) {
		c.anchor = -1
	}
}

func (c *cadence) phase() string {
	switch {
	case c.calibrations >= matureAfter:
		return phaseMature
	case c.calibrations >= stableAfter:
		return phaseStable
	case c.calibrations > 0:
		return phaseWarmup
	}
	return phaseProbe
}

// elect picks the anchor among the timed live ranks: the cohort is every
// rank within anchorCohort of the slowest; the current anchor stays while
// it is in the cohort and no member is anchorDominance slower than it,
// else the slowest member takes over.
func (c *cadence) elect(live []uint32) {
	var slowest float64
	for _, r := range live {
		slowest = max(slowest, c.ms(r))
	}
	if slowest == 0 {
		return
	}
	cur := int64(-1)
	if c.anchor >= 0 && slices.Contains(live, uint32(c.anchor)) && c.ms(uint32(c.anchor)) > 0 {
		cur = c.anchor
	}
	if cur >= 0 {
		ams := c.ms(uint32(cur))
		inCohort := ams >= (1-anchorCohort)*slowest
		dominated := slowest >= (1+anchorDominance)*ams
		if inCohort && !dominated {
			return
		}
	}
	for _, r := range live {
		if c.ms(r) == slowest {
			c.anchor = int64(r)
			return
		}
	}
}

// plan returns each live rank's batches for the next window. A rank with
// no timing yet gets base (the probe window); once every live rank is
// timed the window is a calibration.
func (c *cadence) plan(live []uint32) map[uint32]uint64 {
	timed := true
	var slowest float64
	for _, r := range live {
		ms := c.ms(r)
		timed = timed && ms > 0
		slowest = max(slowest, ms)
	}
	anchorMS := slowest
	if timed {
		c.elect(live)
		if c.anchor >= 0 {
			anchorMS = c.ms(uint32(c.anchor))
		}
	}
	out := make(map[uint32]uint64, len(live))
	for _, r := range live {
		want := c.base
		if ms := c.ms(r); ms > 0 && anchorMS > 0 {
			ratio := min(anchorMS/ms, cadenceMaxRatio)
			want = max(uint64(math.Round(float64(c.base)*ratio)), 1)
		}
		if prev, ok := c.counts[r]; ok && prev > 0 {
			if math.Abs(float64(want)-float64(prev))/float64(prev) <= cadenceDeadZone {
				want = prev
			}
			if d := c.maxDiff; d > 0 {
				want = min(max(want, prev-min(prev-1, d)), prev+d)
			}
		}
		c.counts[r] = want
		out[r] = want
	}
	if timed {
		c.calibrations++
	}
	return out
}

// observeWindow applies the controller's verdict to the window's base:
// halved (down to minBase, at most once every cooldownRounds windows) when
// the ranks drift, else grown when the round that closed the window cost
// more than target of the window's time (twice the target while warming
// up; never while probing) and the verdict allows it. It returns the base
// before the change, and whether there was one.
func (c *cadence) observeWindow(roundMS, windowMS float64, v verdict) (from uint64, changed bool) {
	from = c.base
	c.sinceShrink++
	if v == verdictShrink {
		if c.base <= c.minBase || c.sinceShrink < cooldownRounds {
			return from, false
		}
		c.base = max(c.minBase, c.base/2)
		c.sinceShrink = 0
		clear(c.counts)
		return from, true
	}
	if v != verdictGrow || !(windowMS > 0) || !(roundMS >= 0) || math.IsInf(roundMS, 0) || math.IsInf(windowMS, 0) {
		return from, false
	}
	target := c.target
	switch c.phase() {
	case phaseProbe:
		return from, false
	case phaseWarmup:
		target *= 2
	}
	overhead := roundMS / windowMS
	if overhead <= target || c.base >= c.maxBase {
		return from, false
	}
	grown := uint64(math.Ceil(float64(c.base) * min(overhead/target, cadenceMaxGrow)))
	grown = min(max(grown, c.base+1), c.maxBase)
	// The anchor's count must follow: drop the remembered counts so the dead
	// zone and max_batch_diff do not hold the old sizes.
	clear(c.counts)
	c.base = grown
	return from, true
}

func (c *cadence) state() *CadenceState {
	s := &CadenceState{Base: c.base, MSPerBatch: map[uint32]float64{}, Calibrations: c.calibrations}
	for r := range c.trust {
		s.MSPerBatch[r] = c.ms(r)
	}
	if c.anchor >= 0 {
		a := uint32(c.anchor)
		s.Anchor = &a
	}
	return s
}

func (c *cadence) restore(s *CadenceState) {
	if s == nil {
		return
	}
	if s.Base > 0 {
		c.base = min(s.Base, c.maxBase)
	}
	for r, ms := range s.MSPerBatch {
		c.observe(r, ms)
	}
	if s.Anchor != nil {
		c.anchor = int64(*s.Anchor)
	}
	c.calibrations = max(s.Calibrations, 0)
}

// finalWindow sizes the epoch's last window, given the counts the cadence
// planned (one per live rank: a rank's count is in inverse proportion to
// its batch time, so count × batch time is the window's length) and the
// batches left. It returns counts unchanged while a later window would
// still get at least one batch per rank; otherwise this window takes the
// whole remainder: crumbs beyond the counts go one at a time where they
// lengthen the window least (the fastest ranks), a shortfall scales every
// count down (largest remainder), and a lone batch on one rank is moved to
// the peer it lengthens least, so no rank runs a one-batch plan while
// another could take it.
func finalWindow(counts []uint64, remaining uint64) []uint64 {
	var sum uint64
	for _, c := range counts {
		sum += c
	}
	if remaining >= sum+uint64(len(counts)) || sum == 0 {
		return slices.Clone(counts)
	}
	// cost is the window length of rank i holding n batches, in units of
	// the anchor's window.
	cost := func(i int, n uint64) float64 { return float64(n) / float64(max(counts[i], 1)) }
	cheapest := func(out []uint64, skip int) int {
		best := -1
		for i := range out {
			if i == skip || counts[i] == 0 {
				continue
			}
			if best < 0 || cost(i, out[i]+1) < cost(best, out[best]+1) {
				best = i
			}
		}
		return best
	}
	var out []uint64
	if remaining >= sum {
		out = slices.Clone(counts)
		for crumbs := remaining - sum; crumbs > 0; crumbs-- {
			out[cheapest(out, -1)]++
		}
		return out
	}
	out = scaleCounts(counts, remaining)
	for {
		holders, lone := 0, -1
		for i, n := range out {
			if n > 0 {
				holders++
			}
			if n == 1 && lone < 0 {
				lone = i
			}
		}
		if lone < 0 || holders < 2 {
			return out
		}
		// The peer must already hold work: moving a lone batch onto an
		// idle rank would only make a new lone batch.
		best := -1
		for i, n := range out {
			if i != lone && n > 0 && (best < 0 || cost(i, n+1) < cost(best, out[best]+1)) {
				best = i
			}
		}
		out[lone]--
		out[best]++
	}
}

// scaleCounts shrinks counts proportionally so they sum to at most total
// (the epoch's last window), by largest remainder; it leaves counts that
// already fit alone.
func scaleCounts(counts []uint64, total uint64) []uint64 {
	var sum uint64
	for _, c := range counts {
		sum += c
	}
	if sum <= total {
		return slices.Clone(counts)
	}
	out := make([]uint64, len(counts))
	type frac struct {
		i   int
		rem float64
	}
	fracs := make([]frac, len(counts))
	var given uint64
	for i, c := range counts {
		exact := float64(c) * float64(total) / float64(sum)
		out[i] = uint64(math.Floor(exact))
		given += out[i]
		fracs[i] = frac{i, exact - float64(out[i])}
	}
	slices.SortStableFunc(fracs, func(a, b frac) int {
		switch {
		case a.rem > b.rem:
			return -1
		case a.rem < b.rem:
			return 1
		}
		return 0
	})
	for k := 0; given < total && k < len(fracs); k++ {
		out[fracs[k].i]++
		given++
	}
	return out
}
