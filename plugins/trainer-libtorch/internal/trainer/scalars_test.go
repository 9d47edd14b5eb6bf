package trainer

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
)

// TestReportsLearningRate: each batch report's "lr" is the rate its step
// used, on the schedule from the plan's global step.
func TestReportsLearningRate(t *testing.T) {
	tr := newTestTrainer(t)
	configure(t, tr, merge(synthData(t, 200, 8, 3), map[string]any{"threads": 1, "batch_size": 50,
		"lr": 0.1, "lr_schedule": "step", "lr_step_size": 2, "lr_gamma": 0.5}))
	var got []float64
	plan := plugin.Plan{Seed: 1, PickSpace: 200, PartitionSize: 200, GlobalStep: 2}
	if err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
		got = append(got, r.Scalars["lr"])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []float64{0.05, 0.05, 0.025, 0.025}
	if !slices.EqualFunc(got, want, func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }) {
		t.Errorf("reported lr %v, want %v", got, want)
	}
}
