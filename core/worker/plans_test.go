package worker

import (
	"testing"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// The queue remembers the shape of the latest plan's epoch and the one
// before it, which an ExtendPartition may still name, and no more: a run
// of many epochs holds two, not one an epoch.
func TestPlanQueueKeepsTwoEpochsShapes(t *testing.T) {
	q := newPlanQueue()
	const epochs = 100
	for e := uint64(0); e < epochs; e++ {
		q.add(&wirepb.EpochPlan{Epoch: e, Seed: 1000 + e, PickSpace: 60000, LrScale: 1})
		q.plans = nil // trained
	}
	if len(q.shapes) != 2 {
		t.Fatalf("after %d epochs the queue holds %d epochs' shapes, want 2", epochs, len(q.shapes))
	}
	for _, c := range []struct {
		epoch, wantSeed uint64
	}{
		{epochs - 1, 1000 + epochs - 1},
		{epochs - 2, 1000 + epochs - 2},
	} {
		q.extend(&wirepb.ExtendPartition{Epoch: c.epoch, PartitionOffset: 5, PartitionSize: 7}, planShape{seed: 1})
		if got := q.plans[len(q.plans)-1].plan.Seed; got != c.wantSeed {
			t.Errorf("an extension of epoch %d runs with seed %d, want its epoch's %d", c.epoch, got, c.wantSeed)
		}
	}
}
