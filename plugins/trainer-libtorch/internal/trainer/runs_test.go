package trainer

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

// runsData are the data sets a run of steps gathers from: float features
// with labels, byte features (kept as bytes: widen_mb 0) with labels, and
// float features with float targets.
func runsData(t *testing.T) map[string]map[string]any {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 6))
	const n, f = 600, 12
	u8 := make([]byte, n*f)
	labels := make([]int64, n)
	x := make([]float32, n*f)
	y := make([]float32, n*2)
	for i := range n {
		var s int
		for j := range f {
			u8[i*f+j] = byte(rng.IntN(256))
			s += int(u8[i*f+j])
			x[i*f+j] = float32(rng.NormFloat64())
		}
		labels[i] = int64(s % 3)
		y[2*i], y[2*i+1] = x[i*f]-x[i*f+1], x[i*f+2]*x[i*f+3]
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	writeNPY(t, p("u8.npy"), "|u1", []int{n, f}, u8)
	writeNPY(t, p("labels.npy"), "<i8", []int{n}, i64Bytes(labels))
	writeNPY(t, p("x.npy"), "<f4", []int{n, f}, f32Bytes(x))
	writeNPY(t, p("y.npy"), "<f4", []int{n, 2}, f32Bytes(y))
	return map[string]map[string]any{
		"float features, labels": synthData(t, n, f, 3),
		"byte features, labels":  {"data_x": p("u8.npy"), "data_y": p("labels.npy"), "widen_mb": 0},
		"float targets":          {"data_x": p("x.npy"), "data_y": p("y.npy"), "loss": "mse", "outputs": 2},
	}
}

// runsTrainer is a trainer configured with kv, with a core to spare for
// gathering beside the steps: plans whose reports merge still train in
// runs of steps, and the others in the prefetching loop.
func runsTrainer(t *testing.T, kv map[string]any) (*Trainer, plugin.TrainerSetup) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(map[string]any{"hidden": []int{16}, "threads": 1, "batch_size": 32, "lr": 0.05}, kv))
	tr.mu.Lock()
	tr.prefetch = true
	tr.mu.Unlock()
	return tr, setup
}

// TestRunsTrainAsSingleSteps: a plan trained in runs of steps in the shim
// (its reports merging) reports the same batches, losses and step counts,
// and leaves the same parameters to the bit, as the same plan trained one
// step per call, on every kind of data set the shim gathers from; and a
// spare core does not keep a plan whose reports merge out of runs.
func TestRunsTrainAsSingleSteps(t *testing.T) {
	for name, data := range runsData(t) {
		t.Run(name, func(t *testing.T) {
			var params [2][]byte
			var reps [2][]plugin.BatchReport
			for i, merge := range []time.Duration{0, time.Hour} {
				tr, setup := runsTrainer(t, data)
				d, _ := attach(t, tr, setup)
				for e := range uint64(3) {
					plan := fullPlan(e, 600)
					plan.ReportMerge = merge
					if err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
						reps[i] = append(reps[i], r)
						return nil
					}); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := tr.Publish(context.Background()); err != nil {
					t.Fatal(err)
				}
				params[i] = bytes.Clone(openMapping(t, d).Bytes())
				if runs := tr.runs; (merge == 0) != (runs == 0) {
					t.Fatalf("report merge %v: %d runs of steps", merge, runs)
				}
			}
			if len(reps[0]) != 57 || len(reps[1]) != len(reps[0]) {
				t.Fatalf("%d and %d reports, want 57 (3 epochs of 19 batches)", len(reps[0]), len(reps[1]))
			}
			for i, a := range reps[0] {
				b := reps[1][i]
				if a.Batch != b.Batch || a.Samples != b.Samples || a.Loss != b.Loss || a.StepCount != b.StepCount || a.Scalars["lr"] != b.Scalars["lr"] {
					t.Fatalf("report %d: one step a call %+v, runs of steps %+v", i, a, b)
				}
			}
			if !bytes.Equal(params[0], params[1]) {
				t.Fatal("the parameters differ after the same plans")
			}
		})
	}
}

// runBatches is longPlan's batches: a few seconds of steps here.
const runBatches = 15000

// longPlan is a plan reported only when a run ends.
func longPlan() plugin.Plan {
	p := fullPlan(0, 32*runBatches)
	p.ReportMerge = time.Hour
	return p
}

// inRun waits until tr's batch loop has held the model for 50 ms on end,
// which only a run of steps in the shim does, so that a test's stop or
// call lands inside a run however long the plan's setup took.
func inRun(t *testing.T, tr *Trainer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var since time.Time
	for {
		switch {
		case tr.mu.TryLock():
			tr.mu.Unlock()
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= 50*time.Millisecond:
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no run of steps started in 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunYieldsToOtherCalls: a Publish during a run of steps waits for a
// step, not for the run, and the run goes on after it, counting the wait
// as the round's.
func TestRunYieldsToOtherCalls(t *testing.T) {
	tr, setup := runsTrainer(t, synthData(t, 2000, 32, 4))
	attach(t, tr, setup)
	var (
		mu      sync.Mutex
		batches uint64
		waited  float64
	)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- tr.Train(context.Background(), longPlan(), func(r plugin.BatchReport) error {
			mu.Lock()
			defer mu.Unlock()
			batches++
			waited += r.RoundWaitMS
			return nil
		})
	}()
	inRun(t, tr)
	called := time.Now()
	if _, err := tr.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	publish := time.Since(called)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	train := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("Publish took %v during %v of training; runs %d, round wait %.2f ms", publish, train, tr.runs, waited)
	if batches != runBatches {
		t.Fatalf("%d batches reported, want %d", batches, runBatches)
	}
	if tr.runs < 2 || publish > train/4 {
		t.Fatalf("the Publish took %v of a %v Train that ran %d runs: it waited for the run", publish, train, tr.runs)
	}
	if waited <= 0 {
		t.Fatal("no report counts the Publish's hold on training")
	}
}

// TestRunStops: a cancelled Train and a Shutdown each end a run of steps
// after the step in progress.
func TestRunStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*Trainer, context.CancelFunc)
		want func(error) bool
	}{
		{"cancel", func(_ *Trainer, cancel context.CancelFunc) { cancel() }, func(err error) bool { return errors.Is(err, context.Canceled) }},
		{"shutdown", func(tr *Trainer, _ context.CancelFunc) { tr.Shutdown(context.Background()) }, func(err error) bool { return err != nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, setup := runsTrainer(t, synthData(t, 2000, 32, 4))
			attach(t, tr, setup)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var batches uint64
			done := make(chan error, 1)
			go func() {
				done <- tr.Train(ctx, longPlan(), func(plugin.BatchReport) error { batches++; return nil })
			}()
			inRun(t, tr)
			stopped := time.Now()
			tc.stop(tr, cancel)
			err := <-done
			if took := time.Since(stopped); !tc.want(err) || took > time.Second || batches == 0 || batches >= runBatches {
				t.Fatalf("Train returned %v %v after the stop, with %d of %d batches reported", err, took, batches, runBatches)
			}
		})
	}
}
