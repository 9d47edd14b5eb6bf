package config

import (
	"strings"
	"testing"
)

// eval_rank takes the two policies and any rank of the run, written as a
// string or a bare number; FixedEvalRank tells the two apart.
func TestEvalRankAccepted(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        string
		fixed       bool
		rank        uint32
	}{
		{"lowest", `"lowest"`, EvalRankLowest, false, 0},
		{"fastest", `"fastest"`, EvalRankFastest, false, 0},
		{"rank as a string", `"3"`, "3", true, 3},
		{"rank as a number", `2`, "2", true, 2},
		{"rank 0", `"0"`, "0", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, "run {\n  ranks = 4\n}\ncoordinator {\n  eval_rank = "+tc.value+"\n}\n", "cohort.hcl")
			if c.Coordinator.EvalRank != tc.want {
				t.Errorf("eval_rank = %q, want %q", c.Coordinator.EvalRank, tc.want)
			}
			if rank, fixed := c.Coordinator.FixedEvalRank(); fixed != tc.fixed || rank != tc.rank {
				t.Errorf("FixedEvalRank = %d, %v; want %d, %v", rank, fixed, tc.rank, tc.fixed)
			}
		})
	}
}

// A --ranks flag that leaves the configured eval rank outside the run is
// refused, and the error points at eval_rank's line.
func TestRanksFlagOrphansEvalRank(t *testing.T) {
	c := mustParse(t, "coordinator {\n  eval_rank = \"3\"\n}\n", "cohort.hcl")
	two := 2
	err := c.Apply(Overrides{Ranks: &two})
	if err == nil || !strings.HasPrefix(err.Error(), "cohort.hcl:2,3-12: coordinator.eval_rank: rank 3 is not in the run: run.ranks = 2") {
		t.Fatalf("Apply(--ranks 2) = %v, want eval_rank refused", err)
	}
	if c.Run.Ranks != 4 {
		t.Errorf("a refused Apply changed run.ranks to %d", c.Run.Ranks)
	}
}
