package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker"
	sharena "github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// TestEpochWithTwoRounds runs two ranks through formation, the initial
// broadcast and one epoch in two chunks with a round after each: the ranks
// hold bitwise equal parameters after every round, the epoch callback fires
// once on the elected rank only, and Shutdown ends both cleanly.
func TestEpochWithTwoRounds(t *testing.T) {
	c := newCoordinator(t)
	const world = 2
	var trainers [world]*plugintest.Trainer
	var fired [world]atomic.Int32
	var runs [world]*running
	for r := range uint32(world) {
		o := c.options(r, world, trainerSettings())
		trainers[r] = inProcess(&o)
		o.EpochFn = func(_ context.Context, epoch uint64) error {
			if epoch != 0 {
				t.Errorf("epoch callback for epoch %d, want 0", epoch)
			}
			fired[r].Add(1)
			return nil
		}
		runs[r] = start(t, o)
	}
	admit := &wirepb.Admit{RunId: "two-rounds", Seed: 7, Epochs: 1}
	links := c.acceptAll(world, admit)

	var digest []byte
	for _, l := range links {
		ready := expect[*wirepb.Ready](l)
		if ready.GetRank() != l.rank || ready.GetSamples() != 256 || ready.GetBatchSize() != 16 || ready.GetParameterCount() != 9 {
			t.Fatalf("rank %d Ready = %v", l.rank, ready)
		}
		if digest != nil && string(digest) != string(ready.GetLayoutDigest()) {
			t.Fatalf("layout digests differ between ranks")
		}
		digest = ready.GetLayoutDigest()
	}

	sync := func(round uint64, mode wirepb.SyncMode) []*wirepb.SyncAck {
		t.Helper()
		for _, l := range links {
			l.send(&wirepb.Sync{Round: round, Mode: mode, Root: 0})
		}
		acks := make([]*wirepb.SyncAck, world)
		for i, l := range links {
			if sr := expect[*wirepb.SnapshotReady](l); sr.GetRound() != round {
				t.Fatalf("SnapshotReady for round %d, want %d", sr.GetRound(), round)
			}
			acks[i] = expect[*wirepb.SyncAck](l)
			if acks[i].GetAborted() || acks[i].GetRound() != round {
				t.Fatalf("rank %d ack = %v", l.rank, acks[i])
			}
		}
		w0, _, _, _ := trainers[0].Snapshot()
		w1, _, _, _ := trainers[1].Snapshot()
		if !slices.Equal(w0, w1) {
			t.Fatalf("after round %d the ranks' weights differ:\n%v\n%v", round, w0, w1)
		}
		return acks
	}

	for _, l := range links {
		l.send(&wirepb.SetEpochCallbackRole{Rank: 0})
	}
	sync(0, wirepb.SyncMode_SYNC_MODE_BROADCAST)

	// Each rank's partition of 128 samples, in two chunks of 4 batches.
	chunk := func(r uint32, i uint64) *wirepb.EpochPlan { return plan(0, uint64(r)*128+i*64, 64, 7, 256) }
	for _, l := range links {
		l.send(&wirepb.Update{Version: 0})
		l.send(&wirepb.StartEpoch{Plan: chunk(l.rank, 0)})
	}
	if e := expect[*wirepb.EpochFnElapsed](links[0]); e.GetEpoch() != 0 {
		t.Fatalf("EpochFnElapsed = %v", e)
	}
	for _, l := range links {
		m := expectPlan(l, 4)
		if m.GetSamples() != 64 || m.GetPartitionOffset() != uint64(l.rank)*128 || m.GetPartitionSize() != 64 || !(m.GetAvgLoss() > 0) {
			t.Fatalf("rank %d Metrics = %v", l.rank, m)
		}
	}
	before, _, _, _ := trainers[0].Snapshot()
	acks := sync(1, wirepb.SyncMode_SYNC_MODE_AVERAGE)
	for _, a := range acks {
		// Four steps each, weighed steps^1.
		if a.GetWeight() != 4 || a.GetTotalWeight() != 8 || a.Divergence == nil || a.GetStepCount() != 4 {
			t.Fatalf("round 1 ack = %v", a)
		}
	}
	after, _, _, _ := trainers[0].Snapshot()
	if slices.Equal(before, after) {
		t.Fatalf("round 1 left rank 0's weights as they were: nothing was averaged")
	}

	// The second chunk comes with the round's Update, as the sync policy
	// dispatches it; same epoch, so no second callback.
	for _, l := range links {
		l.send(&wirepb.Update{Version: 1, NextPlan: chunk(l.rank, 1)})
	}
	for _, l := range links {
		b := expect[*wirepb.Batch](l)
		if b.SyncDivergence == nil {
			t.Fatalf("rank %d: first Batch after a round carries no divergence", l.rank)
		}
		expectPlanRest(l, 1, 4)
	}
	sync(2, wirepb.SyncMode_SYNC_MODE_AVERAGE)

	for _, l := range links {
		l.send(&wirepb.Shutdown{})
	}
	for i, l := range links {
		if e := expect[*wirepb.Exiting](l); e.GetRank() != l.rank {
			t.Fatalf("Exiting names rank %d", e.GetRank())
		}
		if err := runs[i].wait(frameWait); err != nil {
			t.Fatalf("rank %d: Run = %v, want nil after Shutdown", i, err)
		}
	}
	if fired[0].Load() != 1 || fired[1].Load() != 0 {
		t.Fatalf("epoch callback fired %d times on rank 0 and %d on rank 1, want 1 and 0", fired[0].Load(), fired[1].Load())
	}
	expectNoWorkerGoroutines(t)
}

// TestThrottle parks a rank with a plan queued: coordinator heartbeats do
// not wake it, the next command does.
func TestThrottle(t *testing.T) {
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "20ms"
	o := c.options(0, 1, ts)
	inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "throttle", Seed: 3})
	expect[*wirepb.Ready](l)

	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 96, 3, 256)})
	expect[*wirepb.Batch](l)
	// Both queue behind the plan in training.
	l.send(&wirepb.StartEpoch{Plan: plan(1, 0, 32, 3, 256)})
	l.send(&wirepb.Throttle{})
	if m := expectPlanRest(l, 1, 6); m.GetEpoch() != 0 {
		t.Fatalf("first Metrics is for epoch %d", m.GetEpoch())
	}
	for i := range 4 {
		l.send(&wirepb.CoordinatorHeartbeat{Sequence: uint64(i)})
		if m := l.next(150 * time.Millisecond); m != nil {
			t.Fatalf("a throttled rank sent %s", describe(m))
		}
	}
	l.send(&wirepb.SetGlobalStep{GlobalStep: 9})
	if m := expectPlan(l, 2); m.GetEpoch() != 1 {
		t.Fatalf("Metrics after the throttle is for epoch %d, want 1", m.GetEpoch())
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// TestExtendPartition: ranges appended during a plan run right after it,
// in arrival order and ahead of a chunk queued before them, each with its
// own Metrics, drawn from the same epoch permutation (no sample twice).
func TestExtendPartition(t *testing.T) {
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "15ms"
	ts.Ledger = filepath.Join(t.TempDir(), "ledger")
	o := c.options(0, 1, ts)
	tr := inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "extend", Seed: 5})
	expect[*wirepb.Ready](l)

	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 64, 5, 256)})
	expect[*wirepb.Batch](l)
	l.send(&wirepb.StartEpoch{Plan: plan(0, 64, 32, 5, 256)})
	l.send(&wirepb.ExtendPartition{Epoch: 0, PartitionOffset: 128, PartitionSize: 48})
	l.send(&wirepb.ExtendPartition{Epoch: 0, PartitionOffset: 200, PartitionSize: 32})

	want := []struct{ offset, size, batches uint64 }{
		{0, 64, 4}, // the plan in training (one batch already read)
		{128, 48, 3},
		{200, 32, 2},
		{64, 32, 2},
	}
	for i, w := range want {
		read := 0
		if i == 0 {
			read = 1
		}
		m := expectPlanRest(l, read, int(w.batches))
		if m.GetPartitionOffset() != w.offset || m.GetPartitionSize() != w.size || m.GetSamples() != w.size {
			t.Fatalf("plan %d: Metrics = %v, want offset %d size %d samples %d", i, m, w.offset, w.size, w.size)
		}
	}
	if _, _, _, trained := tr.Snapshot(); trained != 176 {
		t.Fatalf("trainer trained %d samples, want 176", trained)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
	lines, err := os.ReadFile(ts.Ledger)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		if seen[line] {
			t.Fatalf("sample %q trained twice: an extension used another permutation", line)
		}
		seen[line] = true
	}
	if len(seen) != 176 {
		t.Fatalf("ledger holds %d samples, want 176", len(seen))
	}
}

// TestDeclareDeadAbortsRound: with the peer never arriving, a round is
// stuck until DeclareDead; then it is acknowledged as aborted, promptly, the
// rank stays up, answers RequestSessionId, and completes the next round on
// the new session, weighing the steps of the aborted round too.
func TestDeclareDeadAbortsRound(t *testing.T) {
	cases := []struct {
		name string
		// duringRound: DeclareDead while the round waits; otherwise while
		// the rank trains, before the Sync is handled.
		duringRound bool
		// deaf: the averager ignores Abort (a backend that misses it), so
		// only the worker's own means end the round.
		deaf bool
	}{
		{"during the round", true, false},
		{"before the round", false, false},
		{"during the round, abort missed", true, true},
		{"before the round, abort missed", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCoordinator(t)
			ts := trainerSettings()
			ts.SleepPerBatch = "20ms"
			o := c.options(0, 2, ts)
			if tc.deaf {
				o.Plugins = worker.InProcess(plugintest.NewTrainer(nil), deafAverager{plugintest.NewAverager(nil)})
			} else {
				inProcess(&o)
			}
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "dead", Seed: 1})
			expect[*wirepb.Ready](l)

			l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 64, 1, 256)})
			var sent time.Time
			if !tc.duringRound {
				expect[*wirepb.Batch](l)
				l.send(&wirepb.DeclareDead{Rank: 1, Reason: "test"})
				l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, NextPlan: plan(0, 64, 32, 1, 256)})
				expectPlanRest(l, 1, 4)
				expect[*wirepb.SnapshotReady](l)
				sent = time.Now()
			} else {
				expectPlan(l, 4)
				l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, NextPlan: plan(0, 64, 32, 1, 256)})
				expect[*wirepb.SnapshotReady](l)
				if m := l.next(300 * time.Millisecond); m != nil {
					t.Fatalf("the round ended without its peer: %s", describe(m))
				}
				l.send(&wirepb.DeclareDead{Rank: 1, Reason: "test"})
				sent = time.Now()
			}
			ack := expect[*wirepb.SyncAck](l)
			if !ack.GetAborted() || ack.GetError() == "" || ack.GetRound() != 1 {
				t.Fatalf("ack = %v, want aborted with a reason", ack)
			}
			if d := time.Since(sent); d > 2*time.Second {
				t.Fatalf("abort took %v", d)
			}

			l.send(&wirepb.RequestSessionId{Generation: 1})
			sid := expect[*wirepb.SessionIdGenerated](l)
			if sid.GetGeneration() != 1 || len(sid.GetSessionId()) == 0 {
				t.Fatalf("SessionIdGenerated = %v", sid)
			}
			// The plan that came with the aborted round's Sync is held
			// (expect fails on its Batch frames) until a round succeeds.
			l.send(&wirepb.NewSession{Generation: 1, SessionId: sid.GetSessionId(), NewRank: 0, NewWorldSize: 1, Members: []uint32{0}})
			l.send(&wirepb.Sync{Round: 2, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
			expect[*wirepb.SnapshotReady](l)
			ack = expect[*wirepb.SyncAck](l)
			if ack.GetAborted() || ack.GetWeight() != 4 || ack.GetTotalWeight() != 4 {
				t.Fatalf("round on the new session: ack = %v, want weight 4 of 4", ack)
			}
			if m := expectPlan(l, 2); m.GetPartitionOffset() != 64 {
				t.Fatalf("after the round: Metrics %v, want the held plan at offset 64", m)
			}

			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// deafAverager is the mock averager with an Abort that does nothing.
type deafAverager struct{ *plugintest.Averager }

func (deafAverager) Abort(context.Context, string) error { return nil }

// TestExit covers how a worker ends: only a clean Shutdown is announced
// with Exiting and returns nil; a lost, silent or failing coordinator or
// trainer is an error and sends no Exiting, within the liveness timeout.
func TestExit(t *testing.T) {
	cases := []struct {
		name     string
		settings func(*plugintest.TrainerSettings)
		// act runs after Ready; the worker must then end within within.
		act     func(l *link)
		within  time.Duration
		wantErr error // nil: a clean exit
		anyErr  bool
	}{
		{
			name:   "shutdown",
			act:    func(l *link) { l.send(&wirepb.Shutdown{}) },
			within: 3 * time.Second,
		},
		{
			name: "shutdown then the coordinator closes",
			act: func(l *link) {
				l.send(&wirepb.Shutdown{})
				l.raw.CloseWrite()
			},
			within: 3 * time.Second,
		},
		{
			name: "coordinator silent",
			act: func(l *link) {
				l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 1, 256)})
			},
			within:  2500 * time.Millisecond, // liveness timeout 1 s
			wantErr: worker.ErrCoordinatorSilent,
		},
		{
			name:    "link broken",
			act:     func(l *link) { l.raw.CloseWrite() },
			within:  2 * time.Second,
			wantErr: worker.ErrLinkLost,
		},
		{
			name:     "trainer fails",
			settings: func(s *plugintest.TrainerSettings) { s.FailAfterBatches = 2 },
			act:      func(l *link) { l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 128, 1, 256)}) },
			within:   3 * time.Second,
			anyErr:   true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCoordinator(t)
			ts := trainerSettings()
			if tc.settings != nil {
				tc.settings(&ts)
			}
			o := c.options(0, 1, ts)
			o.LivenessTimeout = time.Second
			o.HeartbeatInterval = 100 * time.Millisecond
			inProcess(&o)
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "exit", Seed: 1})
			expect[*wirepb.Ready](l)
			acted := time.Now()
			tc.act(l)
			err := run.wait(tc.within + 5*time.Second)
			if d := time.Since(acted); d > tc.within {
				t.Errorf("worker took %v to end, want at most %v", d, tc.within)
			}
			frames := l.drain()
			clean := tc.wantErr == nil && !tc.anyErr
			switch {
			case clean && err != nil:
				t.Fatalf("Run = %v, want nil", err)
			case !clean && err == nil:
				t.Fatalf("Run = nil, want an error")
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("Run = %v, want %v", err, tc.wantErr)
			}
			// After a closed link nothing can be read back; otherwise
			// Exiting must be there exactly for a clean exit.
			if tc.name != "shutdown then the coordinator closes" && hasExiting(frames) != clean {
				t.Fatalf("Exiting sent = %v, want %v", hasExiting(frames), clean)
			}
			expectNoWorkerGoroutines(t)
		})
	}
}

// TestShutdownWithSave: the rank saves into dir/rank-<r>, the trainer into
// its own folder there, answers CheckpointResult, then Exiting; a later run
// admitted with that directory as resume_dir loads it, from its own rank's
// directory or else the lowest, and so does one admitted with a checkpoint
// saved before the folders (the trainer's files straight in rank-<r>).
func TestShutdownWithSave(t *testing.T) {
	ckpt := t.TempDir()
	var saved []float32
	var savedSteps uint64
	t.Run("save", func(t *testing.T) {
		c := newCoordinator(t)
		o := c.options(0, 1, trainerSettings())
		tr := inProcess(&o)
		run := start(t, o)
		l := c.accept(&wirepb.Admit{RunId: "save", Seed: 2})
		expect[*wirepb.Ready](l)
		l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 64, 2, 256)})
		expectPlan(l, 4)
		l.send(&wirepb.ShutdownWithSave{Reason: wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED, Dir: ckpt, Version: 3})
		res := expect[*wirepb.CheckpointResult](l)
		want := filepath.Join(ckpt, "rank-0", "trainer", plugintest.CheckpointFile)
		if res.GetVersion() != 3 || res.GetError() != "" || !slices.Equal(res.GetFiles(), []string{want}) {
			t.Fatalf("CheckpointResult = %v, want version 3 and file %s", res, want)
		}
		if _, err := os.Stat(want); err != nil {
			t.Fatalf("checkpoint file: %v", err)
		}
		expect[*wirepb.Exiting](l)
		if err := run.wait(frameWait); err != nil {
			t.Fatal(err)
		}
		saved, _, savedSteps, _ = tr.Snapshot()
	})
	if saved == nil {
		t.FailNow()
	}
	flat := t.TempDir()
	if err := os.MkdirAll(filepath.Join(flat, "rank-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(ckpt, "rank-0", "trainer", plugintest.CheckpointFile), filepath.Join(flat, "rank-0", plugintest.CheckpointFile))
	for _, rw := range []struct {
		rank, world uint32
		dir         string
	}{{0, 1, ckpt}, {1, 2, ckpt}, {1, 2, flat}} {
		t.Run("resume", func(t *testing.T) {
			c := newCoordinator(t)
			o := c.options(rw.rank, rw.world, trainerSettings())
			tr := inProcess(&o)
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "resume", Seed: 2, ResumeDir: rw.dir})
			expect[*wirepb.Ready](l)
			w, _, steps, _ := tr.Snapshot()
			if !slices.Equal(w, saved) || steps != savedSteps {
				t.Fatalf("rank %d resumed weights %v (%d steps), want %v (%d steps)", rw.rank, w, steps, saved, savedSteps)
			}
			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCheckpointAndEvaluate: only the target rank answers, with a result
// that says what happened.
func TestCheckpointAndEvaluate(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "ckpt", Seed: 2})
	expect[*wirepb.Ready](l)
	dir := filepath.Join(t.TempDir(), "v1", "rank-0")

	l.send(&wirepb.Checkpoint{Version: 1, TargetRank: 3, Dir: dir})
	l.send(&wirepb.Evaluate{ScheduleId: 1, Epoch: 1, TargetRank: 3})
	l.send(&wirepb.Checkpoint{Version: 1, TargetRank: 0, Dir: dir})
	res := expect[*wirepb.CheckpointResult](l)
	if res.GetVersion() != 1 || res.GetError() != "" || len(res.GetFiles()) != 1 {
		t.Fatalf("CheckpointResult = %v", res)
	}
	if _, err := os.Stat(res.GetFiles()[0]); err != nil {
		t.Fatal(err)
	}
	l.send(&wirepb.Checkpoint{Version: 2, TargetRank: 0, Dir: ""})
	if res := expect[*wirepb.CheckpointResult](l); res.GetVersion() != 2 || res.GetError() == "" {
		t.Fatalf("a save without a directory: CheckpointResult = %v, want an error", res)
	}
	l.send(&wirepb.Evaluate{ScheduleId: 4, Epoch: 2, TargetRank: 0})
	ev := expect[*wirepb.EvalResult](l)
	if ev.GetScheduleId() != 4 || ev.GetEpoch() != 2 || ev.GetSamples() != 64 || ev.Accuracy == nil || ev.GetError() != "" {
		t.Fatalf("EvalResult = %v", ev)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownInterruptsPlan: a Shutdown or ShutdownWithSave that arrives
// while a plan trains cancels the plan (no Metrics for it) instead of
// waiting for it to finish.
func TestShutdownInterruptsPlan(t *testing.T) {
	cases := []struct {
		name string
		msg  func(dir string) proto.Message
	}{
		{"shutdown", func(string) proto.Message { return &wirepb.Shutdown{} }},
		{"shutdown with save", func(dir string) proto.Message {
			return &wirepb.ShutdownWithSave{Dir: dir, Version: 1, Reason: wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCoordinator(t)
			ts := trainerSettings()
			ts.SleepPerBatch = "100ms"
			o := c.options(0, 1, ts)
			inProcess(&o)
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "interrupt", Seed: 1})
			expect[*wirepb.Ready](l)
			l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 256, 1, 256)}) // 16 batches: 1.6 s
			expect[*wirepb.Batch](l)
			sent := time.Now()
			msg := tc.msg(t.TempDir())
			l.send(msg)
			_, wantResult := msg.(*wirepb.ShutdownWithSave)
			gotResult := false
			for {
				m := l.next(frameWait)
				if _, ok := m.(*wirepb.Batch); ok {
					continue // the batch in progress may still report
				}
				if r, ok := m.(*wirepb.CheckpointResult); ok && !gotResult && r.GetError() == "" {
					gotResult = true
					continue
				}
				if _, ok := m.(*wirepb.Exiting); !ok {
					t.Fatalf("got %s, want Exiting", describe(m))
				}
				break
			}
			if gotResult != wantResult {
				t.Fatalf("CheckpointResult before Exiting: %v, want %v", gotResult, wantResult)
			}
			if d := time.Since(sent); d > 600*time.Millisecond {
				t.Fatalf("the plan was not interrupted: Exiting came %v after the shutdown", d)
			}
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEASGDBlend: under the async policy the averaged parameters are
// blended into the local ones (so ranks stay apart), but a broadcast makes
// every rank equal to the root.
func TestEASGDBlend(t *testing.T) {
	const alpha = 0.25
	c := newCoordinator(t)
	var trainers [2]*plugintest.Trainer
	for r := range uint32(2) {
		o := c.options(r, 2, trainerSettings())
		o.EASGDAlpha = alpha
		trainers[r] = inProcess(&o)
		start(t, o)
	}
	links := c.acceptAll(2, &wirepb.Admit{RunId: "easgd", Seed: 4})
	round := func(n uint64, mode wirepb.SyncMode) {
		t.Helper()
		for _, l := range links {
			l.send(&wirepb.Sync{Round: n, Mode: mode, Root: 1})
		}
		for _, l := range links {
			expect[*wirepb.SnapshotReady](l)
			if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() {
				t.Fatalf("ack = %v", ack)
			}
		}
	}
	for _, l := range links {
		expect[*wirepb.Ready](l)
		l.send(&wirepb.StartEpoch{Plan: plan(0, uint64(l.rank)*64, 64, 4, 256)})
		expectPlan(l, 4)
	}
	round(0, wirepb.SyncMode_SYNC_MODE_BROADCAST)
	w0, _, _, _ := trainers[0].Snapshot()
	w1, _, _, _ := trainers[1].Snapshot()
	if !slices.Equal(w0, w1) {
		t.Fatalf("a broadcast under EASGD left the ranks apart")
	}
	for _, l := range links {
		l.send(&wirepb.StartEpoch{Plan: plan(1, uint64(l.rank)*64, 64, 4, 256)})
		expectPlan(l, 4)
	}
	w0, _, _, _ = trainers[0].Snapshot()
	w1, _, _, _ = trainers[1].Snapshot()
	round(1, wirepb.SyncMode_SYNC_MODE_AVERAGE)
	for r, local := range [][]float32{w0, w1} {
		got, _, _, _ := trainers[r].Snapshot()
		for j := range local {
			// The mock averager's step-weighted mean (4 steps each), then
			// the trainer's blend.
			avg := float32((4*float64(w0[j]) + 4*float64(w1[j])) / 8)
			want := float32((1-alpha)*float64(local[j]) + alpha*float64(avg))
			if got[j] != want {
				t.Fatalf("rank %d weight %d = %v, want %v (blend %v of local %v and mean %v)", r, j, got[j], want, alpha, local[j], avg)
			}
		}
	}
	for _, l := range links {
		l.send(&wirepb.Shutdown{})
		expect[*wirepb.Exiting](l)
	}
}

// TestOddFrames: frames that make no sense are refused without harm, and
// the worker carries on.
func TestOddFrames(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "odd", Seed: 1})
	expect[*wirepb.Ready](l)

	l.send(&wirepb.DeclareDead{Rank: 7})                                               // no such rank
	l.send(&wirepb.StartEpoch{})                                                       // no plan
	l.send(&wirepb.Admit{RunId: "again"})                                              // a second Admit
	l.send(&wirepb.Evaluate{ScheduleId: 1, TargetRank: 1 << 31})                       // another rank's
	l.send(&wirepb.Sync{Round: 0, Mode: wirepb.SyncMode_SYNC_MODE_BROADCAST, Root: 5}) // root not a member
	expect[*wirepb.SnapshotReady](l)
	if ack := expect[*wirepb.SyncAck](l); !ack.GetAborted() || !strings.Contains(ack.GetError(), "root 5") {
		t.Fatalf("broadcast from a non-member: ack = %v, want aborted", ack)
	}
	// Still a working rank.
	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 1, 256)})
	expectPlan(l, 2)
	l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
	expect[*wirepb.SnapshotReady](l)
	if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() || ack.GetWeight() != 2 {
		t.Fatalf("ack = %v, want a completed round of weight 2", ack)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// TestOptionsRefused: Run refuses options it cannot work with before it
// touches the network.
func TestOptionsRefused(t *testing.T) {
	good := func() worker.Options {
		return worker.Options{
			Coordinator: "127.0.0.1:1", Rank: 0, World: 1, Secret: testSecret,
			Trainer: config.Plugin{Name: "mock"}, Averager: config.Plugin{Name: "mock"},
		}
	}
	cases := []struct {
		name   string
		change func(*worker.Options)
		want   string
	}{
		{"no coordinator", func(o *worker.Options) { o.Coordinator = "" }, "no coordinator"},
		{"rank out of range", func(o *worker.Options) { o.Rank = 1 }, "rank 1 out of range"},
		{"empty world", func(o *worker.Options) { o.World = 0 }, "world size 0"},
		{"short secret", func(o *worker.Options) { o.Secret = []byte("short") }, "secret is 5 bytes"},
		{"no trainer", func(o *worker.Options) { o.Trainer.Name = "" }, "no trainer"},
		{"no averager", func(o *worker.Options) { o.Averager.Name = "" }, "no averager"},
		{"alpha above 1", func(o *worker.Options) { o.EASGDAlpha = 1.5 }, "EASGD alpha"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.change(&o)
			err := worker.Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// slowTrainer is the mock trainer with a Configure that takes a while, as a
// libtorch trainer loading its model and data does.
type slowTrainer struct {
	*plugintest.Trainer
	delay time.Duration
}

func (s slowTrainer) Configure(ctx context.Context, cfg plugin.TrainerConfig) (plugin.TrainerSetup, error) {
	time.Sleep(s.delay)
	return s.Trainer.Configure(ctx, cfg)
}

// TestHeartbeatDuringSetup: the rank's heartbeat starts at admission, so a
// slow plugin setup is not mistaken for a dead rank by the coordinator.
func TestHeartbeatDuringSetup(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	o.HeartbeatInterval = 50 * time.Millisecond
	o.Plugins = worker.InProcess(slowTrainer{plugintest.NewTrainer(nil), 500 * time.Millisecond}, plugintest.NewAverager(nil))
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "slow", Seed: 1})
	beats := 0
	for ready := false; !ready; {
		select {
		case m := <-l.frames:
			switch m.(type) {
			case *wirepb.Heartbeat:
				beats++
			case *wirepb.Ready:
				ready = true
			default:
				t.Fatalf("before Ready: %s", describe(m))
			}
		case <-time.After(frameWait):
			t.Fatal("no Ready")
		}
	}
	if beats < 3 {
		t.Fatalf("%d heartbeats during a 500 ms setup, want at least 3", beats)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// TestStopAbortsStalledRound: a round stuck with no death declared (the
// coordinator gives up on a reduce stall) does not keep the rank from a
// ShutdownWithSave: the round is acknowledged as aborted, the rank saves
// and exits cleanly.
func TestStopAbortsStalledRound(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 2, trainerSettings())
	inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "stall", Seed: 1})
	expect[*wirepb.Ready](l)
	l.send(&wirepb.Sync{Round: 0, Mode: wirepb.SyncMode_SYNC_MODE_BROADCAST, Root: 0})
	expect[*wirepb.SnapshotReady](l)
	if m := l.next(200 * time.Millisecond); m != nil {
		t.Fatalf("the round ended without its peer: %s", describe(m))
	}
	l.send(&wirepb.ShutdownWithSave{Reason: wirepb.ShutdownReason_SHUTDOWN_REASON_REDUCE_STALL, Dir: t.TempDir(), Version: 1})
	if ack := expect[*wirepb.SyncAck](l); !ack.GetAborted() {
		t.Fatalf("ack = %v, want aborted", ack)
	}
	if res := expect[*wirepb.CheckpointResult](l); res.GetError() != "" || len(res.GetFiles()) != 1 {
		t.Fatalf("CheckpointResult = %v", res)
	}
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// stepTrainer is the mock trainer that records each plan's GlobalStep.
type stepTrainer struct {
	*plugintest.Trainer
	mu    sync.Mutex
	steps []uint64
}

func (s *stepTrainer) Train(ctx context.Context, p plugin.Plan, report func(plugin.BatchReport) error) error {
	s.mu.Lock()
	s.steps = append(s.steps, p.GlobalStep)
	s.mu.Unlock()
	return s.Trainer.Train(ctx, p, report)
}

// TestGlobalStepPassedOnce: a SetGlobalStep reaches the trainer with the
// next plan only; the plans after it carry 0, so the trainer counts on
// from it instead of going back to it at every plan (a one-rank cohort
// runs many plans between SetGlobalSteps). Ready passes on the averager's
// SoloIdentity.
func TestGlobalStepPassedOnce(t *testing.T) {
	for _, lone := range []bool{false, true} {
		c := newCoordinator(t)
		o := c.options(0, 1, trainerSettings())
		tr := &stepTrainer{Trainer: plugintest.NewTrainer(nil)}
		o.Plugins = worker.InProcess(tr, plugintest.NewAverager(nil))
		if lone {
			s := plugintest.DefaultAveragerSettings()
			s.LoneRounds = true
			o.Averager.Settings = s.JSON()
		}
		run := start(t, o)
		l := c.accept(&wirepb.Admit{RunId: "steps", Seed: 3})
		if r := expect[*wirepb.Ready](l); r.GetSoloIdentity() == lone {
			t.Fatalf("lone_rounds %v: Ready.solo_identity = %v", lone, r.GetSoloIdentity())
		}
		l.send(&wirepb.SetGlobalStep{GlobalStep: 40})
		for i := range 3 {
			l.send(&wirepb.StartEpoch{Plan: plan(0, uint64(32*i), 32, 3, 256)})
			expectPlan(l, 2)
		}
		l.send(&wirepb.SetGlobalStep{GlobalStep: 77})
		l.send(&wirepb.StartEpoch{Plan: plan(0, 96, 32, 3, 256)})
		expectPlan(l, 2)
		l.send(&wirepb.Shutdown{})
		expect[*wirepb.Exiting](l)
		if err := run.wait(frameWait); err != nil {
			t.Fatal(err)
		}
		tr.mu.Lock()
		got := slices.Clone(tr.steps)
		tr.mu.Unlock()
		if want := []uint64{40, 0, 0, 77}; !slices.Equal(got, want) {
			t.Errorf("plans' global steps %v, want %v", got, want)
		}
	}
}

// TestSyncAckCountsHostCopies: a round's SyncAck carries the parameter
// bytes the trainer's Publish and the averager's round copied between
// device and host, added up (summary.json's averaging.host_copy_bytes is
// the sum over ranks and rounds).
func TestSyncAckCountsHostCopies(t *testing.T) {
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.HostCopyBytes = 1000
	o := c.options(0, 1, ts)
	inProcess(&o)
	as := plugintest.DefaultAveragerSettings()
	as.LoneRounds, as.HostCopyBytes = true, 234
	o.Averager.Settings = as.JSON()
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "copies", Seed: 3})
	expect[*wirepb.Ready](l)
	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 3, 256)})
	expectPlan(l, 2)
	l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
	expect[*wirepb.SnapshotReady](l)
	if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() || ack.GetHostCopyBytes() != 1234 {
		t.Fatalf("SyncAck = %v, want host_copy_bytes 1000 + 234", ack)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// TestSyncBringsNextPlan: a plan that comes with a Sync starts right after
// the round's SyncAck, before any Update, with the Sync's global step.
func TestSyncBringsNextPlan(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	tr := &stepTrainer{Trainer: plugintest.NewTrainer(nil)}
	o.Plugins = worker.InProcess(tr, plugintest.NewAverager(nil))
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "prefetch", Seed: 3})
	expect[*wirepb.Ready](l)
	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 3, 256)})
	expectPlan(l, 2)
	gs := uint64(70)
	l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, NextPlan: plan(0, 32, 32, 3, 256), GlobalStep: &gs})
	expect[*wirepb.SnapshotReady](l)
	if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() {
		t.Fatalf("ack %v", ack)
	}
	if m := expectPlan(l, 2); m.GetPartitionOffset() != 32 {
		t.Fatalf("Metrics %v, want the Sync's plan", m)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if want := []uint64{0, 70}; !slices.Equal(tr.steps, want) {
		t.Errorf("plans' global steps %v, want %v", tr.steps, want)
	}
}

// TestMergedBatchReports: a plan that lets its reports merge sends them as
// few frames whose counts and sums add up to the plan, the last before the
// plan's Metrics; a plan that does not sends one frame per batch.
func TestMergedBatchReports(t *testing.T) {
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "merge", Seed: 3})
	expect[*wirepb.Ready](l)

	merging := plan(0, 0, 64, 3, 256)
	merging.ReportIntervalMs = 60_000
	l.send(&wirepb.StartEpoch{Plan: merging})
	b := expect[*wirepb.Batch](l)
	if b.GetBatches() != 4 || b.GetSamples() != 64 || b.GetStepCount() != 4 || !(b.GetBatchLoss() > 0) {
		t.Fatalf("merged frame %v, want 4 batches, 64 samples, step 4, a mean loss", b)
	}
	if m := expect[*wirepb.Metrics](l); m.GetBatches() != 4 || m.GetSamples() != 64 {
		t.Fatalf("Metrics %v", m)
	}
	l.send(&wirepb.StartEpoch{Plan: plan(0, 64, 32, 3, 256)})
	for range 2 {
		if b := expect[*wirepb.Batch](l); b.GetBatches() != 1 || b.GetSamples() != 16 {
			t.Fatalf("per-batch frame %v", b)
		}
	}
	expect[*wirepb.Metrics](l)
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}

// TestStopSendsMergedReports: a save that interrupts a plan whose reports
// merge still hears of the batches trained before it: their frame reaches
// the coordinator before the CheckpointResult, so the checkpoint knows what
// the saved model holds.
func TestStopSendsMergedReports(t *testing.T) {
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "50ms"
	o := c.options(0, 1, ts)
	tr := inProcess(&o)
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "merged-stop", Seed: 3})
	expect[*wirepb.Ready](l)
	merging := plan(0, 0, 256, 3, 256) // 16 batches
	merging.ReportIntervalMs = 60_000
	l.send(&wirepb.StartEpoch{Plan: merging})
	deadline := time.Now().Add(frameWait)
	for {
		if _, _, steps, _ := tr.Snapshot(); steps >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the trainer never got 3 batches in")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.send(&wirepb.ShutdownWithSave{Dir: t.TempDir(), Version: 1, Reason: wirepb.ShutdownReason_SHUTDOWN_REASON_TOO_FEW_RANKS})
	var reported uint64
	for {
		m := l.next(frameWait)
		if b, ok := m.(*wirepb.Batch); ok {
			reported += uint64(b.GetBatches())
			continue
		}
		if _, ok := m.(*wirepb.CheckpointResult); !ok {
			t.Fatalf("got %s, want Batch frames, then CheckpointResult", describe(m))
		}
		break
	}
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
	// The mock applies a batch's step before its sleep: a stop inside the
	// sleep leaves that one step unreported.
	_, _, steps, _ := tr.Snapshot()
	if reported+1 < steps || reported > steps {
		t.Fatalf("%d batches reported before the save, the trainer took %d steps", reported, steps)
	}
}

// A worker whose coordinator never comes says whom it waits for and gives
// up after worker.connect_timeout with an error that names the address,
// the timeout and the setting.
func TestConnectGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there now
	var logs plugintest.LogBuffer
	o := newCoordinator(t).options(0, 1, trainerSettings())
	o.Coordinator, o.ConnectTimeout = addr, 1500*time.Millisecond
	o.Logger = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	inProcess(&o)
	start := time.Now()
	err = worker.Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "gave up after 1.5s") || !strings.Contains(err.Error(), "worker.connect_timeout") {
		t.Fatalf("Run = %v, want it to give up on %s after 1.5s naming worker.connect_timeout", err, addr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %v, want about 1.5s", d)
	}
	if !strings.Contains(logs.String(), "waiting for the coordinator") || !strings.Contains(logs.String(), addr) {
		t.Errorf("the worker never said whom it waits for:\n%s", logs.String())
	}
}

// deviceTrainer is the mock trainer that also says it takes device blocks
// and exports block, counting the calls.
type deviceTrainer struct {
	*plugintest.Trainer
	block   sharena.DeviceBlock
	exports atomic.Int32
	id      byte // the first byte of the block's handle
}

func (d *deviceTrainer) Describe(ctx context.Context) (plugin.Description, error) {
	desc, err := d.Trainer.Describe(ctx)
	desc.Capabilities = append(desc.Capabilities, plugin.CapDeviceBlock)
	return desc, err
}

func (d *deviceTrainer) Configure(ctx context.Context, cfg plugin.TrainerConfig) (plugin.TrainerSetup, error) {
	setup, err := d.Trainer.Configure(ctx, cfg)
	d.block = sharena.DeviceBlock{GPU: "boot/0000:3b:00.0", Handle: [64]byte{9, d.id}, Size: setup.Layout.DeviceBytes()}
	return setup, err
}

func (d *deviceTrainer) ExportDevice(context.Context) (sharena.DeviceBlock, bool, error) {
	d.exports.Add(1)
	return d.block, true, nil
}

// deviceAverager is the mock averager that says, or not, it takes device
// blocks and keeps the descriptor Configure got.
type deviceAverager struct {
	*plugintest.Averager
	takes bool
	delay time.Duration // each Average takes at least this long
	mu    sync.Mutex
	got   sharena.Descriptor
}

func (d *deviceAverager) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	select {
	case <-time.After(d.delay):
	case <-ctx.Done():
		return plugin.RoundResult{}, ctx.Err()
	}
	return d.Averager.Average(ctx, r)
}

func (d *deviceAverager) Describe(ctx context.Context) (plugin.Description, error) {
	desc, err := d.Averager.Describe(ctx)
	if d.takes {
		desc.Capabilities = append(desc.Capabilities, plugin.CapDeviceBlock)
	}
	return desc, err
}

func (d *deviceAverager) Configure(ctx context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	d.mu.Lock()
	d.got = cfg.Arena
	d.mu.Unlock()
	return d.Averager.Configure(ctx, cfg)
}

// The trainer's parameters on the GPU reach the averager in its arena
// descriptor when both plugins take device blocks; otherwise the trainer
// is not asked and stays on the arena.
func TestDeviceBlockReachesTheAverager(t *testing.T) {
	for _, takes := range []bool{true, false} {
		t.Run(fmt.Sprintf("averager takes blocks=%v", takes), func(t *testing.T) {
			c := newCoordinator(t)
			o := c.options(0, 1, trainerSettings())
			tr := &deviceTrainer{Trainer: plugintest.NewTrainer(nil)}
			av := &deviceAverager{Averager: plugintest.NewAverager(nil), takes: takes}
			o.Plugins = worker.InProcess(tr, av)
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "device", Seed: 3})
			expect[*wirepb.Ready](l)
			av.mu.Lock()
			got := av.got
			av.mu.Unlock()
			if takes {
				if tr.exports.Load() != 1 || got.Device == nil || *got.Device != tr.block {
					t.Fatalf("exports %d, averager's descriptor %+v; want the trainer's block", tr.exports.Load(), got.Device)
				}
			} else if tr.exports.Load() != 0 || got.Device != nil {
				t.Fatalf("exports %d, averager's device %+v; want neither", tr.exports.Load(), got.Device)
			}
			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// lostTrainer is a deviceTrainer whose process "dies" after dieAfter
// batches of a plan, or with dieAfterPublish at the first batch after a
// Publish (its calls fail as a lost gRPC connection does), and that
// counts what the worker asks of it.
type lostTrainer struct {
	deviceTrainer
	dieAfter        int
	dieAfterPublish bool
	published       atomic.Bool
	gone            *atomic.Bool
	adopts, loads   atomic.Int32
	loadedFrom      atomic.Value
	loadReason      atomic.Value
	// atDeath is the model's weights when the trainer "died".
	atDeath []float32
}

// errTrainerGone is what a lostTrainer's calls fail with once it "died".
var errTrainerGone = status.Error(codes.Unavailable, "mock trainer process gone")

func (d *lostTrainer) Train(ctx context.Context, p plugin.Plan, report func(plugin.BatchReport) error) error {
	n := 0
	err := d.Trainer.Train(ctx, p, func(b plugin.BatchReport) error {
		if d.dieAfter > 0 && n == d.dieAfter || d.dieAfterPublish && d.published.Load() {
			d.atDeath, _, _, _ = d.Snapshot()
			d.gone.Store(true)
			return errTrainerGone
		}
		n++
		return report(b)
	})
	if d.gone.Load() {
		return errTrainerGone
	}
	return err
}

func (d *lostTrainer) Publish(ctx context.Context) (plugin.PublishResult, error) {
	if d.gone.Load() {
		return plugin.PublishResult{}, errTrainerGone
	}
	d.published.Store(true)
	return d.Trainer.Publish(ctx)
}

func (d *lostTrainer) Adopt(ctx context.Context, alpha float64) (float64, error) {
	d.adopts.Add(1)
	return d.Trainer.Adopt(ctx, alpha)
}

func (d *lostTrainer) LoadCheckpoint(ctx context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	d.loads.Add(1)
	d.loadedFrom.Store(dir)
	d.loadReason.Store(reason)
	return d.Trainer.LoadCheckpoint(ctx, dir, reason)
}

// swapPlugins are in-process plugins the worker can replace: each start
// makes a fresh trainer or averager, and a trainer that died says so.
type swapPlugins struct {
	averagerTakes bool
	// dieAfterPublish: the first trainer dies at the first batch after
	// a Publish, not after 3 batches.
	dieAfterPublish bool
	roundDelay      time.Duration // each averager's rounds take this long

	mu        sync.Mutex
	trainers  []*lostTrainer
	averagers []*deviceAverager
	stopped   []pluginhost.Kind
}

func (s *swapPlugins) StartTrainer(context.Context, string) (plugin.Trainer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tr := &lostTrainer{deviceTrainer: deviceTrainer{Trainer: plugintest.NewTrainer(nil)}, gone: new(atomic.Bool)}
	if len(s.trainers) == 0 {
		tr.dieAfterPublish = s.dieAfterPublish
		if !s.dieAfterPublish {
			tr.dieAfter = 3
		}
	}
	tr.id = byte(len(s.trainers) + 1)
	s.trainers = append(s.trainers, tr)
	return tr, nil
}

func (s *swapPlugins) StartAverager(context.Context, string) (plugin.Averager, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	av := &deviceAverager{Averager: plugintest.NewAverager(nil), takes: s.averagerTakes, delay: s.roundDelay}
	s.averagers = append(s.averagers, av)
	return av, nil
}

func (s *swapPlugins) StopAll(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, tr := range s.trainers {
		errs = append(errs, tr.Shutdown(ctx))
	}
	for _, av := range s.averagers {
		errs = append(errs, av.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

func (s *swapPlugins) Exited(kind pluginhost.Kind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return kind == pluginhost.Trainer && s.trainers[len(s.trainers)-1].gone.Load()
}

func (s *swapPlugins) Stop(_ context.Context, kind pluginhost.Kind) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = append(s.stopped, kind)
	return nil
}

// A trainer lost mid-plan is replaced. When its parameters lived in a
// device block, the block died with it: the new trainer resumes from the
// last checkpoint rather than adopting the arena's parameters (stale: no
// round ever wrote them), exports a block of its own, and the averager,
// whose map of the old block is dead, is replaced and handed the new one.
// On the arena the new trainer loads the checkpoint as a replacement
// (optimizer state and counters) and adopts the arena, and the averager
// stays: its model is the lost trainer's when it died, not the
// checkpoint's, also when the model lived in the arena and the new
// trainer's Attach wrote its fresh one there.
func TestTrainerLostWithItsDeviceBlock(t *testing.T) {
	for _, tc := range []struct{ device, zeroCopy bool }{{true, false}, {false, false}, {false, true}} {
		device := tc.device
		t.Run(fmt.Sprintf("device=%v/zero-copy=%v", device, tc.zeroCopy), func(t *testing.T) {
			c := newCoordinator(t)
			ts := trainerSettings()
			ts.ZeroCopy, ts.Momentum = tc.zeroCopy, 0.5
			o := c.options(0, 1, ts)
			o.PluginRestarts = 2
			sp := &swapPlugins{averagerTakes: device}
			o.Plugins = sp
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "lost-block", Seed: 5})
			expect[*wirepb.Ready](l)
			ckpt := filepath.Join(t.TempDir(), "ckpt-1", "rank-0")
			l.send(&wirepb.Checkpoint{Version: 1, TargetRank: 0, Dir: ckpt})
			if res := expect[*wirepb.CheckpointResult](l); res.GetError() != "" {
				t.Fatalf("CheckpointResult = %v", res)
			}

			l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 256, 1, 256)})
			for range 3 {
				expect[*wirepb.Batch](l)
			}
			pr := expect[*wirepb.PluginRestarted](l)
			if pr.GetKind() != "trainer" || !pr.GetPlanLost() || pr.GetPartitionSize() != 256 {
				t.Fatalf("PluginRestarted = %v, want the trainer with the lost plan", pr)
			}
			if device {
				if pr := expect[*wirepb.PluginRestarted](l); pr.GetKind() != "averager" || !strings.Contains(pr.GetReason(), "GPU") {
					t.Fatalf("PluginRestarted = %v, want the averager, for the block that died", pr)
				}
			}

			sp.mu.Lock()
			trainers, averagers, stopped := slices.Clone(sp.trainers), slices.Clone(sp.averagers), slices.Clone(sp.stopped)
			sp.mu.Unlock()
			if len(trainers) != 2 {
				t.Fatalf("%d trainers started, want 2", len(trainers))
			}
			fresh := trainers[1]
			wantReason := plugin.LoadReplacement
			if device {
				wantReason = plugin.LoadResume
			}
			if n, from, reason := fresh.loads.Load(), fresh.loadedFrom.Load(), fresh.loadReason.Load(); n != 1 || from != filepath.Join(ckpt, "trainer") || reason != wantReason {
				t.Errorf("new trainer loaded %d checkpoints (from %v, reason %v), want 1 from %s/trainer, reason %v", n, from, reason, ckpt, wantReason)
			}
			// A model in the arena is there when its trainer dies.
			if got, _, _, _ := fresh.Snapshot(); tc.zeroCopy && !slices.Equal(got, trainers[0].atDeath) {
				t.Errorf("new trainer's weights %v, want the lost trainer's when it died, %v", got, trainers[0].atDeath)
			}
			wantAverager, wantAdopts, wantStopped := 1, int32(1), []pluginhost.Kind{pluginhost.Trainer}
			if device {
				wantAverager, wantAdopts = 2, 0
				wantStopped = append(wantStopped, pluginhost.Averager)
			}
			if got := fresh.adopts.Load(); got != wantAdopts {
				t.Errorf("new trainer adopted the arena %d times, want %d", got, wantAdopts)
			}
			if len(averagers) != wantAverager || !slices.Equal(stopped, wantStopped) {
				t.Fatalf("%d averagers started and %v stopped, want %d and %v", len(averagers), stopped, wantAverager, wantStopped)
			}
			last := averagers[len(averagers)-1]
			last.mu.Lock()
			got := last.got.Device
			last.mu.Unlock()
			switch {
			case device && (fresh.exports.Load() != 1 || got == nil || *got != fresh.block):
				t.Errorf("new averager got block %+v (new trainer exported %d), want the new trainer's %+v", got, fresh.exports.Load(), fresh.block)
			case !device && got != nil:
				t.Errorf("averager got block %+v, want none", got)
			}

			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// copyFile copies the file src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A trainer lost while a round runs beside its plan leaves the round's
// averaging to finish (the peers wait in it for this rank's part), then
// the round is acknowledged as aborted, the trainer replaced, and the
// round run again completes.
func TestTrainerLostWhileARoundAverages(t *testing.T) {
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "5ms"
	o := c.options(0, 1, ts)
	o.PluginRestarts = 1
	sp := &swapPlugins{dieAfterPublish: true, roundDelay: 150 * time.Millisecond}
	o.Plugins = sp
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "lost-averaging", Seed: 1, OverlapRounds: true})
	expect[*wirepb.Ready](l)

	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 256, 1, 256)})
	expect[*wirepb.Batch](l)
	l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, Overlap: true})
	ack, pr := expectLostRound(l)
	if !ack.GetAborted() || !strings.Contains(ack.GetError(), "trainer was lost") {
		t.Fatalf("SyncAck = %v, want round 1 aborted for the lost trainer", ack)
	}
	if held := ack.GetRoundMs(); held < 150 {
		t.Errorf("the aborted round took %.1f ms: its averaging (150 ms) was cut short", held)
	}
	if pr.GetKind() != "trainer" || !pr.GetPlanLost() {
		t.Fatalf("PluginRestarted = %v, want the trainer with its plan lost", pr)
	}
	l.send(&wirepb.Sync{Round: 2, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
	expectRoundDone(l, 2)
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}
