package conformance

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/cohortdl/cohort/shared/arena"
)

// saveLoad: a round after SaveState and LoadState into fresh averagers
// equals the same round of averagers that kept going.
func (s *avgSuite) saveLoad(t T, settings json.RawMessage) {
	steps := countUp(int(s.o.world))
	// Two rounds before the save, as an outer optimizer may take one to
	// start and a second to build its momentum.
	before := func(c *cohort) {
		c.average(all(c), 1, steps)
		c.fill(2)
		c.average(all(c), 2, steps)
		c.fill(3)
	}
	// The averagers that keep going: rounds 1 to 3.
	kept := s.newCohort(t, s.o.world, settings)
	idx := all(kept)
	before(kept)
	kept.average(idx, 3, steps)
	want := kept.snapshot()

	// Rounds 1 and 2, saved; round 3 on fresh averagers that load them.
	saved := s.newCohort(t, s.o.world, settings)
	before(saved)
	dirs := make([]string, len(idx))
	for _, r := range idx {
		dirs[r] = t.TempDir()
		ctx, cancel := callCtx(CallBound)
		files, err := saved.ranks[r].avg.SaveState(ctx, dirs[r])
		cancel()
		if err != nil {
			t.Fatalf("SaveState must succeed after a round: rank %d: %v", r, err)
		}
		for _, f := range files {
			if rel, err := filepath.Rel(dirs[r], f); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("SaveState must write into the directory it is given (%s): rank %d returned %s", dirs[r], r, f)
			} else if _, err := os.Stat(f); err != nil {
				t.Errorf("SaveState must return the files it wrote: rank %d returned %s: %v", r, f, err)
			}
		}
	}
	fresh := s.newCohort(t, s.o.world, settings)
	errs := make([]error, len(idx))
	fresh.each(idx, func(ctx context.Context, r int) { errs[r] = fresh.ranks[r].avg.LoadState(ctx, dirs[r]) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("LoadState must restore what SaveState wrote: rank %d: %v", r, err)
		}
	}
	fresh.fill(3)
	fresh.average(idx, 3, steps)
	got := fresh.snapshot()
	const promise = "a round after SaveState and LoadState into a fresh averager must equal the same round of an averager that kept going (state lost across Save/Load?)"
	for _, r := range idx {
		for i, e := range fresh.layout.Entries {
			if e.DType != arena.F32 {
				continue
			}
			for k := 0; k < int(e.Bytes/4); k++ {
				g, w := float64(f32(got[r][i], k)), float64(f32(want[r][i], k))
				if !(math.Abs(g-w) <= Tolerance*math.Max(math.Abs(w), 1e-6)) {
					t.Errorf("%s: rank %d, %q[%d]: got %v, want %v", promise, r, e.Name, k, g, w)
					return
				}
			}
		}
	}

	// A directory without the averager's files leaves it fresh.
	empty := s.newCohort(t, s.o.world, settings)
	none := t.TempDir()
	empty.each(idx, func(ctx context.Context, r int) { errs[r] = empty.ranks[r].avg.LoadState(ctx, none) })
	for r, err := range errs {
		if err != nil {
			t.Errorf("LoadState of a directory without the averager's files must leave it fresh, not fail: rank %d: %v", r, err)
		}
	}
}

// solo: an averager that claims SoloIdentity leaves a lone member's arena
// bit for bit as it is.
func (s *avgSuite) solo(t T, settings json.RawMessage) {
	c := s.newCohort(t, 1, settings)
	if !c.ranks[0].traits.SoloIdentity {
		t.Logf("Configure does not claim SoloIdentity under settings %s: nothing to check", settings)
		return
	}
	pre := c.snapshot()
	c.average([]int{0}, 1, []uint64{3})
	c.checkUnchanged("Configure claimed SoloIdentity, but a lone member's round changed the arena", []int{0}, pre, true)
}
