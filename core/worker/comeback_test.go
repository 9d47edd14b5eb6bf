package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// A rank that loses its coordinator mid-plan keeps its plugins and model
// and redials: a coordinator that comes back for the same run gets Ready
// with what the model holds beyond the last round (the batches of the
// interrupted plan, as one span from the plan's start, the one the loss
// cut before its report included) and that round's number, and the rank
// serves it; one that starts another run is refused, and the rank exits
// with an error.
func TestComeback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		admit  *wirepb.Admit
		refuse string // the worker's error, when it must not rejoin
	}{
		{name: "the same run", admit: &wirepb.Admit{RunId: "cb", Seed: 1, Epochs: 1, Comeback: true}},
		{name: "another run", admit: &wirepb.Admit{RunId: "other", Seed: 1, Epochs: 1}, refuse: "afresh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCoordinator(t)
			ts := trainerSettings()
			ts.SleepPerBatch = "20ms"
			o := c.options(0, 1, ts)
			o.LivenessTimeout = 5 * time.Second
			o.HeartbeatInterval = 100 * time.Millisecond
			tr := inProcess(&o)
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "cb", Seed: 1, Epochs: 1})
			expect[*wirepb.Ready](l)
			l.send(&wirepb.Sync{Round: 4, Mode: wirepb.SyncMode_SYNC_MODE_BROADCAST})
			expect[*wirepb.SnapshotReady](l)
			if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() {
				t.Fatalf("round 4 aborted: %v", ack)
			}
			l.send(&wirepb.StartEpoch{Plan: plan(0, 32, 160, 1, 256)})
			for range 3 {
				expect[*wirepb.Batch](l)
			}
			l.raw.Close()
			lost := time.Now()

			back := c.accept(tc.admit)
			if tc.refuse != "" {
				err := run.wait(10 * time.Second)
				if err == nil || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("Run = %v, want a refusal (%q)", err, tc.refuse)
				}
				expectNoWorkerGoroutines(t)
				return
			}
			ready := expect[*wirepb.Ready](back)
			t.Logf("Ready again %v after the loss", time.Since(lost).Round(time.Millisecond))
			k := ready.GetKept()
			if k == nil || k.GetRunId() != "cb" || k.GetLastRound() != 4 || len(k.GetHeld()) != 1 {
				t.Fatalf("Ready.kept = %v, want run cb, last round 4, one span", k)
			}
			if s := k.GetHeld()[0]; s.GetEpoch() != 0 || s.GetOffset() != 32 || s.GetBatches() < 3 || s.GetSize() != 16*s.GetBatches() {
				t.Errorf("held span %v, want epoch 0 from offset 32, at least 3 batches of 16", s)
			}
			// The loss cut a batch's sleep, after its step: the model holds
			// it though no report said so, and so must Ready.kept.
			if _, _, steps, trained := tr.Snapshot(); k.GetHeld()[0].GetSize() != trained {
				t.Errorf("held span %v, but the trainer trained %d samples in %d steps since round 4", k.GetHeld()[0], trained, steps)
			}
			// The rank serves the coordinator that came back: a round (its
			// held work published into it), a plan, then Shutdown.
			back.send(&wirepb.Sync{Round: 5, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
			expect[*wirepb.SnapshotReady](back)
			if ack := expect[*wirepb.SyncAck](back); ack.GetAborted() || ack.GetRound() != 5 {
				t.Fatalf("round 5 after the comeback: %v", ack)
			}
			back.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 1, 256)})
			expectPlan(back, 2)
			back.send(&wirepb.Shutdown{})
			if err := run.wait(10 * time.Second); err != nil {
				t.Fatalf("Run = %v after the comeback's Shutdown, want nil", err)
			}
			if !hasExiting(back.drain()) {
				t.Error("no Exiting to the coordinator that came back")
			}
			expectNoWorkerGoroutines(t)
		})
	}
}

// A killed coordinator takes its reduce server with it: the averager's
// round can fail on that socket before the rank reads the control link's
// end. The round is then the coordinator's loss, not the averager's: the
// rank waits for the coordinator to come back, with the round's work
// still held, instead of exiting with an averaging error.
func TestComebackAfterTheAveragersServerWentFirst(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	o.LivenessTimeout = 5 * time.Second
	o.HeartbeatInterval = 100 * time.Millisecond
	avg := &serverLostAverager{Averager: plugintest.NewAverager(nil), failed: make(chan struct{})}
	o.Plugins = worker.InProcess(plugintest.NewTrainer(nil), avg)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "cb", Seed: 1, Epochs: 1})
	expect[*wirepb.Ready](l)
	l.send(&wirepb.Sync{Round: 4, Mode: wirepb.SyncMode_SYNC_MODE_BROADCAST})
	expect[*wirepb.SnapshotReady](l)
	expect[*wirepb.SyncAck](l)
	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 64, 1, 256)})
	expectPlan(l, 4)
	avg.fail.Store(true)
	l.send(&wirepb.Sync{Round: 5, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
	expect[*wirepb.SnapshotReady](l)
	<-avg.failed
	time.Sleep(50 * time.Millisecond)
	l.raw.Close()

	back := c.accept(&wirepb.Admit{RunId: "cb", Seed: 1, Epochs: 1, Comeback: true})
	k := expect[*wirepb.Ready](back).GetKept()
	if k.GetLastRound() != 4 || len(k.GetHeld()) != 1 || k.GetHeld()[0].GetSize() != 64 {
		t.Fatalf("Ready.kept = %v, want last round 4 and the plan's 64 samples held", k)
	}
	back.send(&wirepb.Shutdown{})
	if err := run.wait(10 * time.Second); err != nil {
		t.Fatalf("Run = %v, want nil after the comeback's Shutdown", err)
	}
	expectNoWorkerGoroutines(t)
}

// serverLostAverager fails a round once fail is set, as averaging-cpu
// does when its reduce server's socket closes.
type serverLostAverager struct {
	*plugintest.Averager
	fail   atomic.Bool
	failed chan struct{}
}

func (a *serverLostAverager) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	if a.fail.CompareAndSwap(true, false) {
		close(a.failed)
		return plugin.RoundResult{}, errors.New("averager: data channel to the reduce server lost: connection reset by peer")
	}
	return a.Averager.Average(ctx, r)
}
