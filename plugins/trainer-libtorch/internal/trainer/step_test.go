package trainer

import (
	"context"
	"os"
	"runtime"
	"strconv"
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
			before = usage(t).Minflt
		}
		if err := tr.Train(ctx, fullPlan(epoch, setup.Samples), noop); err != nil {
			t.Fatal(err)
		}
	}
	if per := float64(usage(t).Minflt-before) / steps; per > maxEach {
		t.Errorf("%.1f page faults a training step (2 threads, batch %d), want at most %d: freed tensors go back to the kernel between steps", per, batch, maxEach)
	} else {
		t.Logf("%.2f page faults a training step", per)
	}
}

// usage is the process's resource usage so far.
func usage(t *testing.T) syscall.Rusage {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return ru
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

// TestGoRuntimeLeavesTheLoopAlone: while a 1-thread rank trains, the
// process's threads hardly sleep and wake. Nothing in it has work but the
// batch loop, yet Go's sysmon, which preempts a goroutine that ran 10 ms
// without yielding and then polls every 20 µs to see it back, woke some
// 2,000 times a second beside a locked loop of cgo calls; where libtorch's
// threads fill the cores, each wake-up takes one from them.
func TestGoRuntimeLeavesTheLoopAlone(t *testing.T) {
	tr := newTestTrainer(t)
	data := synthData(t, 64*64, 784, 10)
	setup := configure(t, tr, merge(data, map[string]any{"threads": 1, "batch_size": 64}))
	attach(t, tr, setup)
	// The loop gathers its own batches, as on a machine without a spare
	// core: a prefetching goroutine wakes a thread every batch.
	tr.prefetch = false
	noop := func(plugin.BatchReport) error { return nil }
	ctx := context.Background()
	if err := tr.Train(ctx, fullPlan(0, setup.Samples), noop); err != nil {
		t.Fatal(err)
	}
	// One long Train: between two, the loop's goroutine waits for work.
	// Voluntary context switches: the process's threads going to sleep;
	// preemptions by other processes do not count.
	var batches int
	before, start := usage(t).Nvcsw, time.Now()
	if err := tr.Train(ctx, fullPlan(1, 1500*64), func(plugin.BatchReport) error { batches++; return nil }); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// About 2,300 a second when the runtime preempts the loop (sysmon's
	// polling), 500 with the loop yielding first (a hand-off each time).
	const most = 1200
	rate := float64(usage(t).Nvcsw-before) / took.Seconds()
	if rate > most {
		t.Errorf("%.0f voluntary context switches a second in a 1-thread batch loop (%d batches in %v), want at most %d: the Go runtime keeps waking up beside it",
			rate, batches, took.Round(time.Millisecond), most)
	} else {
		t.Logf("%.0f voluntary context switches a second, %d batches in %v", rate, batches, took.Round(time.Millisecond))
	}
}

// TestFirstBatchFindsTheThreadWarm: Configure starts libtorch's per-thread
// state on the batch loop's thread (a pthreadpool worker and an OpenMP
// worker at 2 threads), so the first batch starts no thread: a new
// pthreadpool worker spins for some 25 ms on a core training needs.
func TestFirstBatchFindsTheThreadWarm(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 256, 784, 10), map[string]any{"threads": 2, "batch_size": 64}))
	attach(t, tr, setup)
	tr.prefetch = false // its goroutine may take a thread of its own
	runtime.GC()        // nor start its workers meanwhile
	before := threadIDs(t)
	if err := tr.Train(context.Background(), fullPlan(0, 64), func(plugin.BatchReport) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var started []int
	for id := range threadIDs(t) {
		if !before[id] {
			started = append(started, id)
		}
	}
	// The Go runtime may start a thread of its own at any time.
	if len(started) > 1 {
		t.Errorf("the first batch started threads %v: libtorch's per-thread state was not started at Configure", started)
	}
}

// threadIDs are the process's threads.
func threadIDs(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	ids := map[int]bool{}
	for _, e := range ents {
		if id, err := strconv.Atoi(e.Name()); err == nil {
			ids[id] = true
		}
	}
	return ids
}
