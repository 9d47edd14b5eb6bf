package record

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/status"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// fixed is a Source and a Dispatch that say what the test sets.
type fixed struct{ now Now }

func (f *fixed) Now() Now                                       { return f.now }
func (f *fixed) GlobalStep() uint64                             { return 7 }
func (f *fixed) ControllerSummary() *dispatch.ControllerSummary { return &dispatch.ControllerSummary{} }
func (f *fixed) LiveController() status.Controller              { return status.Controller{} }
func (f *fixed) Bulk() (rounds, bytes uint64)                   { return 0, 0 }

func testRecorder(t *testing.T, world uint32) (*Recorder, *fixed) {
	src := &fixed{}
	return New(Config{Out: t.TempDir(), RunID: "r", World: world, Policy: "sync", Epochs: 2, Started: time.Now(),
		Source: src, Dispatch: src, Bulk: src, Publish: func(*status.Snapshot) {}, Logger: hclog.NewNullLogger()}), src
}

// An epoch counts what the Metrics closed, and what a departed rank's
// Batch reports say it trained of plans no Metrics will close, but only
// of its own epoch's plans; its loss is the batch-weighted mean of both.
func TestEpochCountsUnclosedPlansOfItsEpoch(t *testing.T) {
	r, _ := testRecorder(t, 2)
	r.StartEpoch(1, EpochProgress{Samples: 10, Batches: 1, LossSum: 4, LossBatches: 1})
	r.Metrics(0, &wirepb.Metrics{Samples: 40, Batches: 4, AvgLoss: 1})
	r.Unclosed(dispatch.Trained{Epoch: 1, Samples: 30, Batches: 3, LossSum: 3, LossBatches: 2})
	r.Unclosed(dispatch.Trained{Epoch: 0, Samples: 99, Batches: 9, LossSum: 99, LossBatches: 9})
	s := r.EndEpoch()
	if s.Epoch != 2 || s.Samples != 80 {
		t.Errorf("epoch %d with %d samples, want epoch 2 with 10 before + 40 closed + 30 unclosed", s.Epoch, s.Samples)
	}
	if want := (4.0 + 4 + 3) / (1 + 4 + 2); s.Loss != want {
		t.Errorf("loss %v, want %v", s.Loss, want)
	}
	if got, err := Epochs(r.Finished()); err != nil || len(got) != 1 || got[0].Samples != 80 {
		t.Errorf("finished epochs %+v", got)
	}
}

// A summary names each rank's end: a clean exit, a death with its reason,
// a rank that never joined, one still connected when the run ended; while
// the run goes on a live rank is live and the run is running.
func TestSummaryRankStates(t *testing.T) {
	r, src := testRecorder(t, 4)
	for id, st := range []string{RankLive, RankExited, RankJoined, RankDead} {
		r.RankState(uint32(id), st)
	}
	r.Left(3, "link closed without Exiting")
	src.now = Now{Phase: "training"}
	if s := r.Summary(); s.Status != StatusRunning || s.Ranks[0].State != RankLive || s.GlobalStep != 7 {
		t.Errorf("while running: status %q, rank 0 %q, global step %d", s.Status, s.Ranks[0].State, s.GlobalStep)
	}
	src.now = Now{Done: true, Status: StatusCompleted}
	s := r.Summary()
	want := []RankSummary{
		{Rank: 0, State: RankDead, Reason: "still connected when the run ended"},
		{Rank: 1, State: RankExited},
		{Rank: 2, State: RankDead, Reason: "never joined the cohort"},
		{Rank: 3, State: RankDead, Reason: "link closed without Exiting"},
	}
	for i, w := range want {
		if g := s.Ranks[i]; g.State != w.State || g.Reason != w.Reason {
			t.Errorf("rank %d: %q (%q), want %q (%q)", i, g.State, g.Reason, w.State, w.Reason)
		}
	}
	if s.Status != StatusCompleted || s.Epochs == nil || s.Roles == nil || s.MembershipEvents == nil {
		t.Errorf("summary %+v: want completed, with empty lists rather than null", s)
	}
}

// Under async the wait at the sync is each rank's time in the round
// beyond the fastest rank's; round 0 counts in the run's totals only.
func TestRoundWaits(t *testing.T) {
	r, _ := testRecorder(t, 2)
	acks := map[uint32]*wirepb.SyncAck{0: {RoundMs: 10, BytesMoved: 100}, 1: {RoundMs: 25, BytesMoved: 300}}
	r.Round(0, 1, 30*time.Millisecond, acks, true, false)
	r.StartEpoch(0, EpochProgress{})
	r.Round(1, 1, 30*time.Millisecond, acks, false, false)
	s := r.EndEpoch()
	if s.Rounds != 1 || s.WaitAtSyncMS != 7.5 || s.Ranks[1].WaitAtSyncMS != 15 {
		t.Errorf("%d rounds, wait %v ms (rank 1: %v): want 1 round, a mean wait of (0+15)/2", s.Rounds, s.WaitAtSyncMS, s.Ranks[1].WaitAtSyncMS)
	}
	if sum := r.Summary(); sum.Averaging.Rounds != 2 || sum.Averaging.BytesPerRound != 400 {
		t.Errorf("averaging %+v, want 2 rounds of 400 bytes", sum.Averaging)
	}
}

func TestSummaryRoundTrips(t *testing.T) {
	r, src := testRecorder(t, 1)
	src.now = Now{Done: true, Status: StatusStopped, Checkpoint: "/c"}
	path := filepath.Join(t.TempDir(), SummaryFile)
	if err := WriteJSON(path, r.Summary()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSummary(path)
	if err != nil || got.Status != StatusStopped || got.Checkpoint != "/c" || got.RunID != "r" {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if _, err := ReadSummary(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing summary read without error")
	}
}

// TestPublishDue: a Publish within PublishEvery of the last snapshot is
// deferred, and PublishDue says so until one is made; with nothing
// deferred the loop sets no timer.
func TestPublishDue(t *testing.T) {
	src := &fixed{}
	var snaps int
	r := New(Config{Out: t.TempDir(), RunID: "r", World: 1, Policy: "sync", Epochs: 2, Started: time.Now(),
		Source: src, Dispatch: src, Bulk: src, Publish: func(*status.Snapshot) { snaps++ }, Logger: hclog.NewNullLogger()})
	r.Publish(true)
	if _, due := r.PublishDue(); due || snaps != 1 {
		t.Fatalf("after a forced Publish: due %v, %d snapshots", due, snaps)
	}
	r.Publish(false)
	wait, due := r.PublishDue()
	if !due || wait <= 0 || wait > PublishEvery || snaps != 1 {
		t.Fatalf("after a Publish within PublishEvery: due %v in %v, %d snapshots", due, wait, snaps)
	}
	time.Sleep(wait)
	r.Publish(false)
	if _, due := r.PublishDue(); due || snaps != 2 {
		t.Fatalf("after PublishEvery: due %v, %d snapshots", due, snaps)
	}
}
