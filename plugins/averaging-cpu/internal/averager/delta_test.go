package averager

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// A bf16 wire across hosts sends each round's change, not the parameters:
// when ranks move a little from the last consensus, as training does
// between rounds, the consensus must follow those moves to within bf16's
// precision of the moves, not of the parameters (which would miss moves
// smaller than 0.4% of a value outright), and every host must hold the
// same bits. With or without an outer optimizer holding the previous
// parameters.
func TestBF16WireSendsChanges(t *testing.T) {
	for _, smoothing := range []float64{0, 0.5} {
		t.Run("smoothing="+map[bool]string{true: "on", false: "off"}[smoothing > 0], func(t *testing.T) {
			const world, move = 3, 1e-3
			sets := make([]map[string]any, world)
			for r := range sets {
				sets[r] = map[string]any{"host": "rank", "wire": "bf16", "smoothing": smoothing}
			}
			c := newCohort(t, cohortOpts{world: world, settings: sets, scale: 3})
			steps := []uint64{4, 4, 4}
			c.fill(1)
			for round := uint64(1); round <= 8; round++ {
				if round > 1 {
					// Each rank moves from the consensus it holds.
					for r, m := range c.maps {
						rng := rand.New(rand.NewPCG(round, uint64(r)))
						for i, e := range c.layout.Entries {
							if e.Role != arena.Parameter || e.DType != arena.F32 {
								continue
							}
							b, _ := m.Tensor(i)
							f := arena.AsFloat32s(b)
							for k := range f {
								f[k] += float32(move * rng.NormFloat64())
							}
						}
					}
				}
				pre := c.snapshot()
				ref := reference(c.layout, pre, steps, 1)
				_, errs := c.roundAll(context.Background(), sameRound(world, plugin.Round{Round: round}, steps))
				for r, err := range errs {
					if err != nil {
						t.Fatalf("round %d rank %d: %v", round, r, err)
					}
				}
				post := c.snapshot()
				for i, e := range c.layout.Entries {
					if e.Role != arena.Parameter || e.DType != arena.F32 {
						continue
					}
					for r := 1; r < world; r++ {
						for k := range post[r][i] {
							if math.Float32bits(post[r][i][k]) != math.Float32bits(post[0][i][k]) {
								t.Fatalf("round %d: rank %d's %q[%d] = %v, rank 0's %v", round, r, e.Name, k, post[r][i][k], post[0][i][k])
							}
						}
					}
					if smoothing > 0 {
						continue // the filter's output is not the mean
					}
					// How far the consensus is from the exact mean, against
					// how far the ranks moved this round.
					var d2, m2 float64
					for k, want := range ref[i] {
						x := float64(post[0][i][k]) - want
						d2 += x * x
						y := float64(pre[0][i][k]) - want
						m2 += y*y + move*move
					}
					if tol := 0.02; round > 1 && math.Sqrt(d2/m2) > tol {
						t.Errorf("round %d %q: consensus off the mean by %.3g of the round's moves, over %v", round, e.Name, math.Sqrt(d2/m2), tol)
					}
				}
			}
		})
	}
}
