package trainer

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

// Training steps reuse the heap: the tensors of one step are freed and
// allocated again in the next, and the memory they use must stay mapped
// in between rather than go back to the kernel and come back as fresh
// pages (under glibc's default thresholds a lone rank at 2 threads took
// about 200 page faults a step this way, and 0.3 with the plugin's).
func TestStepsDoNotFaultTheHeap(t *testing.T) {
	const (
		batch   = 64
		steps   = 400
		maxEach = 20 // page faults a step, averaged
	)
	tr := newTestTrainer(t)
	data := synthData(t, 100*batch, 784, 10)
	setup := configure(t, tr, merge(data, map[string]any{"threads": 2, "batch_size": batch}))
	attach(t, tr, setup)
	noop := func(plugin.BatchReport) error { return nil }
	ctx := context.Background()
	// The first epoch sizes the heap; the next ones are measured.
	var before int64
	for epoch := range uint64(1 + steps/100) {
		if epoch == 1 {
			before = minorFaults(t)
		}
		if err := tr.Train(ctx, fullPlan(epoch, setup.Samples), noop); err != nil {
			t.Fatal(err)
		}
	}
	if per := float64(minorFaults(t)-before) / steps; per > maxEach {
		t.Errorf("%.1f page faults a training step (2 threads, batch %d), want at most %d: freed tensors go back to the kernel between steps", per, batch, maxEach)
	} else {
		t.Logf("%.2f page faults a training step", per)
	}
}

// minorFaults is the process's minor page faults so far.
func minorFaults(t *testing.T) int64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// The parameter norm rides on a batch report about once a second, the
// first batch's included: the norm is a pass over every parameter, and
// nothing needs it more often.
func TestParamNormCadence(t *testing.T) {
	tr := newTestTrainer(t)
	data := synthData(t, 20*64, 16, 3)
	setup := configure(t, tr, merge(data, map[string]any{"threads": 1, "batch_size": 64}))
	attach(t, tr, setup)
	var withNorm, batches int
	start := time.Now()
	for epoch := range uint64(10) {
		err := tr.Train(context.Background(), fullPlan(epoch, setup.Samples), func(r plugin.BatchReport) error {
			if batches == 0 && r.ParamNorm == nil {
				t.Error("the first batch report carries no parameter norm")
			}
			if r.ParamNorm != nil {
				withNorm++
				if !(*r.ParamNorm > 0) {
					t.Errorf("batch %d: parameter norm %v", batches, *r.ParamNorm)
				}
			}
			batches++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if most := 1 + int(time.Since(start)/paramNormEvery); withNorm > most {
		t.Errorf("%d of %d batch reports carry the norm in %v, want at most %d", withNorm, batches, time.Since(start), most)
	}
}
