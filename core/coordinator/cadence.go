package coordinator

import (
	"math"
	"slices"

	"github.com/cohortdl/cohort/core/config"
)

// Cadence tuning: the EMA weight of a new batch time, the most batches a
// fast rank gets per anchor batch, the relative change below which a rank's
// count is left alone (so jitter does not reshuffle work every window), and
// the most the window grows in one step.
const (
	cadenceEMA      = 0.3
	cadenceMaxRatio = 64
	cadenceDeadZone = 0.05
	cadenceMaxGrow  = 2.0
)

// cadence sizes the windows of the cadence policy. The slowest rank (the
// anchor) gets base batches per window; every other rank gets as many as it
// can train in the anchor's time, so all of them reach the sync together.
// When a round costs more than target of the window's compute time the
// window grows, so averaging overhead stays bounded.
type cadence struct {
	base    uint64
	maxBase uint64
	target  float64
	ms      map[uint32]float64 // EMA of each rank's batch time
	counts  map[uint32]uint64  // the counts last handed out
}

// CadenceState is the cadence controller's state in a checkpoint, so a
// resumed run starts calibrated.
type CadenceState struct {
	Base       uint64             `json:"base"`
	MSPerBatch map[uint32]float64 `json:"ms_per_batch,omitempty"`
}

func newCadence(base, maxBase uint64, target float64) *cadence {
	base = max(base, 1)
	return &cadence{
		base:    min(base, max(maxBase, 1)),
		maxBase: max(maxBase, 1),
		target:  target,
		ms:      map[uint32]float64{},
		counts:  map[uint32]uint64{},
	}
}

// observe folds one batch time of rank into its EMA. Values that are not
// a finite positive time (a rank may send anything) are ignored.
func (c *cadence) observe(rank uint32, batchMS float64) {
	if !(batchMS > 0) || math.IsInf(batchMS, 0) {
		return
	}
	if old, ok := c.ms[rank]; ok {
		c.ms[rank] = old + cadenceEMA*(batchMS-old)
	} else {
		c.ms[rank] = batchMS
	}
}

// forget drops a dead rank, so it can no longer be the anchor.
func (c *cadence) forget(rank uint32) {
	delete(c.ms, rank)
	delete(c.counts, rank)
}

// plan returns each live rank's batches for the next window. A rank with
// no timing yet gets base (the probe window).
func (c *cadence) plan(live []uint32) map[uint32]uint64 {
	var anchorMS float64
	for _, r := range live {
		anchorMS = max(anchorMS, c.ms[r])
	}
	out := make(map[uint32]uint64, len(live))
	for _, r := range live {
		want := c.base
		if ms, ok := c.ms[r]; ok && anchorMS > 0 {
			ratio := min(anchorMS/ms, cadenceMaxRatio)
			want = max(uint64(math.Round(float64(c.base)*ratio)), 1)
		}
		if prev, ok := c.counts[r]; ok && prev > 0 {
			if math.Abs(float64(want)-float64(prev))/float64(prev) <= cadenceDeadZone {
				want = prev
			}
		}
		c.counts[r] = want
		out[r] = want
	}
	return out
}

// observeWindow grows the window when the round that closed it cost more
// than target of the window's compute time. It returns whether it grew.
func (c *cadence) observeWindow(roundMS, windowMS float64) bool {
	if !(windowMS > 0) || !(roundMS >= 0) || math.IsInf(roundMS, 0) || math.IsInf(windowMS, 0) {
		return false
	}
	overhead := roundMS / windowMS
	if overhead <= c.target || c.base >= c.maxBase {
		return false
	}
	grown := uint64(math.Ceil(float64(c.base) * min(overhead/c.target, cadenceMaxGrow)))
	grown = min(max(grown, c.base+1), c.maxBase)
	// The anchor's count must follow: drop the remembered counts so the dead
	// zone does not hold the old sizes.
	clear(c.counts)
	c.base = grown
	return true
}

func (c *cadence) state() *CadenceState {
	s := &CadenceState{Base: c.base, MSPerBatch: map[uint32]float64{}}
	for r, ms := range c.ms {
		s.MSPerBatch[r] = ms
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

// setupCadence builds the cadence policy's sizing at formation, when the
// epoch's batch count is known; a resumed run continues from the
// checkpoint's window sizes.
func (r *runner) setupCadence() {
	if r.policy != config.PolicyCadence {
		return
	}
	base := uint64(r.cfg.Coordinator.ChunkBatches)
	if base == 0 {
		base = uint64(r.cfg.Coordinator.SyncEvery)
	}
	epochBatches := (r.pickSpace + r.batch - 1) / r.batch
	r.cad = newCadence(base, epochBatches, r.cfg.Coordinator.OverheadTarget)
	if r.c.meta != nil {
		r.cad.restore(r.c.meta.Cadence)
	}
}
