package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// A coordinator that fails (a panic on its loop) mid-epoch ends Run with
// ErrCrashed, closes its links and leaves the consensus file; another
// started on the same address with Resume on the run takes the rank
// workers back and the run completes. This is what `cohort run` does with
// its coordinator. When the same worker.Run calls come back (they never
// return meanwhile), they finish the window they were training, its
// round takes their kept work in, and every sample of every epoch is
// trained exactly once. When rank 1's worker was
// replaced by a fresh one (which loads the checkpoint), the first round
// broadcasts rank 0's kept model: rank 1's work since the consensus is
// trained again, nothing is missing, and the other epochs are trained once.
func TestCrashedCoordinatorComesBack(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		t.Run(map[bool]string{false: "every rank kept its model", true: "rank 1 started fresh"}[fresh], func(t *testing.T) {
			crashAndComeBack(t, fresh)
		})
	}
}

func crashAndComeBack(t *testing.T, fresh bool) {
	cfg := testConfig(t)
	cfg.Run.Ranks, cfg.Run.Epochs = 2, 3
	cfg.Coordinator.CheckpointEvery = 1
	keys, err := wire.DeriveKeys(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	logs := &plugintest.LogBuffer{}
	var batches atomic.Int64
	opts := Options{Config: cfg, Keys: keys, Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}),
		LoopTimer: func(what string, _ time.Duration) {
			// 32 batches an epoch: the 48th Batch is mid-epoch 2.
			if what == "Batch" && batches.Add(1) == 48 {
				panic("a bug in the coordinator")
			}
		}}
	first, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("coordinators' log:\n%s", logs.String())
		}
	})
	addr := first.Addr().String()

	ledger := filepath.Join(t.TempDir(), "ledger")
	ts := plugintest.TrainerSettings{Samples: 512, EvalSamples: 64, Features: 8, BatchSize: 16, LR: 0.1, SleepPerBatch: "2ms", Ledger: ledger}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, cfg.Run.Ranks+1)
	cancels := make([]context.CancelFunc, cfg.Run.Ranks)
	startRank := func(r uint32) {
		o := worker.Options{Coordinator: addr, Rank: r, World: uint32(cfg.Run.Ranks), Secret: testSecret,
			Trainer:         config.Plugin{Name: "mock", Settings: ts.JSON()},
			Averager:        config.Plugin{Name: "mock", Settings: []byte(`{}`)},
			LivenessTimeout: 10 * time.Second, ConnectTimeout: 5 * time.Second, ShutdownGrace: 2 * time.Second,
			ArenaDir: t.TempDir(), Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}),
			Plugins: worker.InProcess(plugintest.NewTrainer(nil), plugintest.NewAverager(nil))}
		wctx, wcancel := context.WithCancel(ctx)
		cancels[r] = wcancel
		go func() { errs <- worker.Run(wctx, o) }()
	}
	for r := range uint32(cfg.Run.Ranks) {
		startRank(r)
	}

	if _, err := first.Run(ctx); !errors.Is(err, ErrCrashed) {
		t.Fatalf("the failing coordinator's Run = %v, want ErrCrashed", err)
	}
	dir := filepath.Join(first.Out(), checkpoint.CheckpointsDir)
	if c, err := checkpoint.ReadConsensus(dir); err != nil || c == nil || c.Last.Epoch != 1 {
		t.Fatalf("consensus file after the crash: %+v, %v; want one in epoch 2", c, err)
	}
	if fresh {
		// Rank 1's worker goes (as if its process were killed too) and a
		// fresh one takes its place.
		cancels[1]()
		if err := <-errs; err == nil {
			t.Fatal("the cancelled worker of rank 1 ended cleanly")
		}
		startRank(1)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	opts.Listener, opts.Resume, opts.LoopTimer = ln, first.Out(), nil
	second, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := second.Run(ctx)
	if err != nil || sum.Status != record.StatusCompleted || len(sum.Epochs) != 3 || sum.RunID != first.RunID() {
		t.Fatalf("the coordinator that came back: %v, status %s, %d epochs, run %s (first %s)", err, sum.Status, len(sum.Epochs), sum.RunID, first.RunID())
	}
	for range cfg.Run.Ranks {
		if err := <-errs; err != nil {
			t.Errorf("a rank worker: %v", err)
		}
	}
	for _, e := range sum.Epochs {
		if e.Samples != 512 {
			t.Errorf("epoch %d counts %d samples, want 512", e.Epoch, e.Samples)
		}
	}
	b, err := os.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r, e, i int
		if _, err := fmt.Sscan(line, &r, &e, &i); err == nil {
			seen[fmt.Sprint(e, i)]++
		}
	}
	for e := range 3 {
		for i := range 512 {
			n := seen[fmt.Sprint(e, i)]
			if n == 1 || fresh && e == 1 && n == 2 {
				continue
			}
			t.Fatalf("epoch %d: sample %d trained %d times, want once (or twice, in the epoch of the crash, with a fresh rank)", e+1, i, n)
		}
	}
	// The record says how the first round started the cohort.
	recs, _ := filepath.Glob(filepath.Join(first.Out(), record.ComebacksDir, "*.json"))
	var rec record.ComebackRecord
	if len(recs) != 1 {
		t.Fatalf("comeback records %v, want one", recs)
	}
	want := record.ComebackRecord{Mode: "continue", Holders: []uint32{0, 1}}
	if fresh {
		want = record.ComebackRecord{Mode: "broadcast", Holders: []uint32{0}}
	}
	if err := record.ReadJSON(recs[0], "comeback record", &rec); err != nil || rec.Mode != want.Mode || !slices.Equal(rec.Holders, want.Holders) || rec.Root != 0 || len(rec.Retrained) != 0 {
		t.Errorf("comeback record %+v (%v), want mode %s, holders %v, nothing of theirs retrained", rec, err, want.Mode, want.Holders)
	}
	if c, _ := checkpoint.ReadConsensus(dir); c != nil {
		t.Error("the consensus file outlived the completed run")
	}
}

// Which ranks' models the first round after a comeback starts from. A
// round in flight when the coordinator died may have succeeded on some
// ranks and been cut off on others: its average holds every rank's work
// of the window, so those ranks are the holders, and nothing of that
// window is trained again.
func TestComebackHolders(t *testing.T) {
	const run = "run-a"
	cons := &checkpoint.Consensus{Round: 108, Last: checkpoint.Meta{Epoch: 1, GlobalStep: 100},
		Pending: &checkpoint.PendingConsensus{Round: 109, State: checkpoint.Meta{Epoch: 1, GlobalStep: 104}}}
	noPending := *cons
	noPending.Pending = nil
	kept := func(round uint64) *wirepb.Kept {
		return &wirepb.Kept{RunId: run, LastRound: round, Held: []*wirepb.Span{{Epoch: 1, Offset: round, Size: 16, Batches: 1}}}
	}
	for _, tc := range []struct {
		name    string
		cons    *checkpoint.Consensus
		kept    []*wirepb.Kept // by rank; nil: started fresh
		round   uint64         // 0: none kept, resume from the checkpoint
		holders []uint32
		root    uint32
		all     bool
	}{
		{"every rank kept the last round", cons, []*wirepb.Kept{kept(108), kept(108)}, 108, []uint32{0, 1}, 0, true},
		{"every rank kept the pending round", cons, []*wirepb.Kept{kept(109), kept(109)}, 109, []uint32{0, 1}, 0, true},
		{"the pending round succeeded on rank 0 only", cons, []*wirepb.Kept{kept(109), kept(108)}, 109, []uint32{0}, 0, false},
		{"the pending round succeeded on rank 1 only", cons, []*wirepb.Kept{kept(108), kept(109), kept(108)}, 109, []uint32{1}, 1, false},
		{"rank 0 started fresh", cons, []*wirepb.Kept{nil, kept(108)}, 108, []uint32{1}, 1, false},
		{"rank 1 kept another run's model", cons, []*wirepb.Kept{kept(108), {RunId: "run-b", LastRound: 109}}, 108, []uint32{0}, 0, false},
		{"a round the file does not know", &noPending, []*wirepb.Kept{kept(109), kept(108)}, 108, []uint32{1}, 1, false},
		{"nothing kept", cons, []*wirepb.Kept{kept(7), nil, nil}, 0, nil, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := make([]uint32, len(tc.kept))
			byRank := map[uint32]*wirepb.Kept{}
			for i, k := range tc.kept {
				live[i] = uint32(i)
				byRank[uint32(i)] = k
			}
			p := planComebackOf(tc.cons, run, live, byRank, hclog.NewNullLogger())
			holders := slices.Sorted(maps.Keys(p.held))
			if p.round != tc.round || !slices.Equal(holders, tc.holders) || p.root != tc.root || p.all != tc.all {
				t.Fatalf("plan: round %d, holders %v, root %d, all %v; want round %d, holders %v, root %d, all %v",
					p.round, holders, p.root, p.all, tc.round, tc.holders, tc.root, tc.all)
			}
			if tc.round == 0 {
				if p.state != nil {
					t.Fatalf("no holder, yet the plan starts from state %+v", p.state)
				}
				return
			}
			want, _ := tc.cons.State(tc.round)
			if p.state == nil || p.state.GlobalStep != want.GlobalStep {
				t.Fatalf("plan state %+v, want round %d's %+v", p.state, tc.round, want)
			}
			for _, id := range holders {
				if got := p.held[id]; len(got) != 1 || got[0].Offset != tc.kept[id].GetLastRound() {
					t.Errorf("rank %d's held work %v, want what it kept", id, got)
				}
			}
		})
	}
}
