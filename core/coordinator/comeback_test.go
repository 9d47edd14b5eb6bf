package coordinator

import (
	"context"
	"errors"
	"fmt"
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
