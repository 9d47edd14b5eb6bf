package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// The epoch callback's time is reported on its own (EpochFnElapsed) and
// stays out of the times the coordinator balances work by: each Batch's
// batch_ms and the plan's epoch_ms cover training alone.
func TestEpochFnTimeIsNotTrainingTime(t *testing.T) {
	// Long beside the plan's 4 batches of 5 ms, so a loaded machine's
	// slower plan is never mistaken for one that holds the callback.
	const callback = time.Second
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "5ms"
	o := c.options(0, 1, ts)
	inProcess(&o)
	o.EpochFn = func(ctx context.Context, _ uint64) error {
		select {
		case <-time.After(callback):
		case <-ctx.Done():
		}
		return nil
	}
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "callback-time", Seed: 3, Epochs: 1})
	expect[*wirepb.Ready](l)

	l.send(&wirepb.SetEpochCallbackRole{Rank: 0})
	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 64, 3, 256)})
	if e := expect[*wirepb.EpochFnElapsed](l); e.GetElapsedMs() < float64(callback/time.Millisecond) {
		t.Fatalf("EpochFnElapsed %v, want at least the callback's %v", e, callback)
	}
	for i := range 4 {
		if b := expect[*wirepb.Batch](l); b.GetBatchMs() >= float64(callback/time.Millisecond) {
			t.Errorf("batch %d took %v ms: the callback's time is in it", i, b.GetBatchMs())
		}
	}
	if m := expect[*wirepb.Metrics](l); m.GetEpochMs() >= float64(callback/time.Millisecond) {
		t.Errorf("plan took %v ms: the callback's time is in it", m.GetEpochMs())
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}
