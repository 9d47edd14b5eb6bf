package coordinator

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Stop mid-epoch: the plans in flight finish, a final round averages
// them, every rank saves through ShutdownWithSave, the checkpoint is
// complete and records a window boundary; a run resumed from it trains
// exactly the samples the first one had not, and its summary covers both.
func TestStopSavesAndResumeFinishes(t *testing.T) {
	cfg := testConfig(t)
	// The first run's batches report lr 1, the resumed run's 3: the
	// resumed epoch's mean must weigh both.
	lr := 1.0
	script := func(uint32) rankScript {
		v := lr
		return rankScript{msPerBatch: 10 * time.Millisecond, samples: 480, scalars: func(nb uint64) map[string]*wirepb.ScalarSum {
			return map[string]*wirepb.ScalarSum{"lr": {Sum: v * float64(nb), Count: nb}}
		}}
	}

	h1 := newHarness(t, cfg, nil)
	ranks := h1.startAll(script)
	waitFor(t, "100 samples of epoch 0", func() bool {
		h1.ledger.mu.Lock()
		defer h1.ledger.mu.Unlock()
		return len(h1.ledger.seen[0]) >= 100
	})
	h1.coord.Stop()
	sum1, err := h1.wait()
	if err != nil || sum1.Status != record.StatusStopped {
		t.Fatalf("first run: status %s, error %v, want stopped", statusOf(sum1), err)
	}
	if sum1.Checkpoint == "" {
		t.Fatal("a stopped run must leave a checkpoint")
	}
	meta, err := checkpoint.ReadMeta(sum1.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Reason != checkpoint.ReasonInterrupted || meta.Epoch != 0 || !slices.Equal(meta.SavedRanks, []uint32{0, 1, 2}) || len(meta.Remaining) != 3 {
		t.Fatalf("meta %+v: want interrupted in epoch 0, saved by ranks 0-2, per-rank remaining", meta)
	}
	for _, f := range ranks {
		sw := messagesOf[*wirepb.ShutdownWithSave](f)
		if len(sw) != 1 || sw[0].GetReason() != wirepb.ShutdownReason_SHUTDOWN_REASON_INTERRUPTED {
			t.Fatalf("rank %d ShutdownWithSave %v", f.id, sw)
		}
		// The last plan ran before the last round: the save holds it.
		last := f.plans[len(f.plans)-1]
		if last.window >= f.roundsDone {
			t.Errorf("rank %d: its last plan (window %d) was not followed by a round (%d done)", f.id, last.window, f.roundsDone)
		}
		if _, err := os.Stat(filepath.Join(sum1.Checkpoint, "rank-"+itoa(f.id), "state.json")); err != nil {
			t.Errorf("rank %d saved nothing: %v", f.id, err)
		}
	}
	// What the first run trained and what the checkpoint says remains are
	// the whole epoch, without overlap.
	var left uint64
	for _, rr := range meta.Remaining {
		left += sumRanges(rr.Ranges)
	}
	h1.ledger.mu.Lock()
	trained := uint64(len(h1.ledger.seen[0]))
	h1.ledger.mu.Unlock()
	if trained+left != 480 || meta.Partial.Samples != trained {
		t.Errorf("trained %d + remaining %d != 480, or partial samples %d != trained", trained, left, meta.Partial.Samples)
	}
	before := meta.Partial.Batches
	if got := meta.Partial.Scalars["lr"]; before == 0 || got != (record.ScalarSum{Sum: float64(before), Count: before}) {
		t.Errorf("partial lr %+v, want the sum and count of the %d batches before the save", got, before)
	}

	h2 := newHarness(t, cfg, func(o *Options) { o.Resume = h1.out; o.Out = h1.out })
	h2.ledger = h1.ledger
	lr = 3
	ranks2 := h2.startAll(script)
	sum2 := h2.mustComplete()
	h2.ledger.checkExactlyOnce(t, 2, 480)
	for _, f := range ranks2 {
		if f.admit.GetResumeDir() != sum1.Checkpoint {
			t.Errorf("rank %d Admit resume_dir %q, want %q", f.id, f.admit.GetResumeDir(), sum1.Checkpoint)
		}
	}
	if len(sum2.Epochs) != 2 || sum2.Epochs[0].Samples != 480 || sum2.Epochs[1].Samples != 480 {
		t.Fatalf("resumed summary epochs %+v: want 2 epochs of 480 samples", sum2.Epochs)
	}
	if got, want := sum2.Epochs[0].Scalars["lr"], float64(before+3*(60-before))/60; math.Abs(got-want) > 1e-12 {
		t.Errorf("resumed epoch's lr %v, want %v: %d batches at 1, the other %d of 60 at 3", got, want, before, 60-before)
	}
	if sum2.ResumedFrom != sum1.Checkpoint || sum2.Averaging.RoundsTotal != meta.Rounds+sum2.Averaging.Rounds {
		t.Errorf("resumed summary: from %q, rounds total %d", sum2.ResumedFrom, sum2.Averaging.RoundsTotal)
	}
}

func itoa(v uint32) string { return string(rune('0' + v)) }

// Stop before the cohort forms ends the run at once, with nothing saved.
func TestStopBeforeFormation(t *testing.T) {
	cfg := testConfig(t)
	h := newHarness(t, cfg, nil)
	h.start()
	h.rank(0, rankScript{})
	waitFor(t, "rank 0 to join", func() bool { return h.logHas("rank joined", "rank=0") })
	h.coord.Stop()
	sum, err := h.wait()
	if err != nil || sum.Status != record.StatusStopped || sum.Checkpoint != "" {
		t.Fatalf("status %s, checkpoint %q, error %v", statusOf(sum), sum.Checkpoint, err)
	}
}

// checkpoint_every: each due epoch ends in a complete checkpoint whose
// meta resumes at the next epoch; a rank that fails to save is left out
// of it, and a checkpoint no rank saved is removed. checkpoint_keep
// removes the oldest beyond it as each new one commits.
func TestEpochCheckpoints(t *testing.T) {
	t.Run("keep 2 of 4", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Run.Epochs, cfg.Coordinator.CheckpointEvery, cfg.Coordinator.CheckpointKeep = 4, 1, 2
		h := newHarness(t, cfg, nil)
		h.startAll(func(uint32) rankScript { return rankScript{} })
		sum := h.mustComplete()
		entries, _ := os.ReadDir(filepath.Join(h.out, checkpoint.CheckpointsDir))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"ckpt-000003", "ckpt-000004"}) || filepath.Base(sum.Checkpoint) != "ckpt-000004" {
			t.Errorf("checkpoints %v, summary names %q; want the last two, ckpt-000004 last", names, sum.Checkpoint)
		}
	})
	cases := []struct {
		name     string
		failSave func(r uint32) bool
		want     []uint32 // saved ranks; nil: no checkpoint
	}{
		{"every rank saves", func(uint32) bool { return false }, []uint32{0, 1, 2}},
		{"one rank fails", func(r uint32) bool { return r == 1 }, []uint32{0, 2}},
		{"every rank fails", func(uint32) bool { return true }, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.CheckpointEvery = 1
			h := newHarness(t, cfg, nil)
			h.startAll(func(r uint32) rankScript { return rankScript{failSave: tc.failSave(r)} })
			sum := h.mustComplete()
			dir := filepath.Join(h.out, checkpoint.CheckpointsDir)
			entries, _ := os.ReadDir(dir)
			if tc.want == nil {
				if len(entries) != 0 || sum.Checkpoint != "" {
					t.Fatalf("checkpoints %v, summary %q: want none", entries, sum.Checkpoint)
				}
				return
			}
			if len(entries) != 2 {
				t.Fatalf("checkpoint directory holds %d entries, want 2", len(entries))
			}
			last, err := checkpoint.LastCheckpoint(dir)
			if err != nil || last != sum.Checkpoint || filepath.Base(last) != "ckpt-000002" {
				t.Fatalf("last checkpoint %q (%v), summary %q", last, err, sum.Checkpoint)
			}
			for i, name := range []string{"ckpt-000001", "ckpt-000002"} {
				m, err := checkpoint.ReadMeta(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if m.Epoch != uint64(i+1) || !slices.Equal(m.SavedRanks, tc.want) || len(m.Finished) != i+1 {
					t.Errorf("%s: epoch %d, saved %v, %d finished epochs; want epoch %d, saved %v", name, m.Epoch, m.SavedRanks, len(m.Finished), i+1, tc.want)
				}
				if i == 0 && (len(m.Remaining) != 3 || sumRanges(m.Remaining[0].Ranges) != 32) {
					t.Errorf("%s: remaining %+v, want epoch 1's fresh partitions", name, m.Remaining)
				}
			}
		})
	}
}

// A completed run resumed with more epochs trains every added epoch in
// full: its last checkpoint (saved after the final epoch) must not read as
// the first added epoch already trained.
func TestResumeFinishedRunWithMoreEpochs(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.CheckpointEvery = 1
	h1 := newHarness(t, cfg, nil)
	h1.startAll(nil)
	sum1 := h1.mustComplete()
	h1.ledger.checkExactlyOnce(t, 2, 96)

	more := *cfg
	more.Run.Epochs = 4
	h2 := newHarness(t, &more, func(o *Options) { o.Resume = h1.out; o.Out = h1.out })
	h2.startAll(nil)
	sum2 := h2.mustComplete()
	h2.ledger.checkEpochs(t, 2, 4, 96)
	if sum2.ResumedFrom != sum1.Checkpoint || len(sum2.Epochs) != 4 {
		t.Fatalf("resumed from %q with %d epochs in the summary; want %q and 4", sum2.ResumedFrom, len(sum2.Epochs), sum1.Checkpoint)
	}
	for _, e := range sum2.Epochs {
		if e.Samples != 96 {
			t.Errorf("epoch %d: %d samples in the summary, want 96", e.Epoch, e.Samples)
		}
	}

	// Resumed again with the run's own length, the last checkpoint holds a
	// finished run: nothing more is trained.
	h3 := newHarness(t, &more, func(o *Options) { o.Resume = h2.out; o.Out = h2.out })
	h3.startAll(nil)
	h3.mustComplete()
	h3.ledger.checkEpochs(t, 0, 0, 96)
}

// Cadence on ranks of unequal speed: the fast rank runs more batches per
// window, and the ranks wait less at the sync than under the sync policy.
func TestCadenceBeatsSyncOnUnequalRanks(t *testing.T) {
	run := func(policy config.Policy) record.EpochSummary {
		cfg := testConfig(t)
		cfg.Run.Ranks = 2
		cfg.Run.Epochs = 1
		cfg.Coordinator.Policy = policy
		cfg.Coordinator.SyncEvery = 4
		h := newHarness(t, cfg, nil)
		h.startAll(func(r uint32) rankScript {
			// A wide gap in speed and enough windows that a loaded
			// machine's scheduling noise does not decide the comparison.
			ms := 12 * time.Millisecond
			if r == 0 {
				ms = 2 * time.Millisecond
			}
			return rankScript{msPerBatch: ms, samples: 1920}
		})
		sum := h.mustComplete()
		h.ledger.checkExactlyOnce(t, 1, 1920)
		return sum.Epochs[0]
	}
	syncE := run(config.PolicySync)
	cadE := run(config.PolicyCadence)
	t.Logf("sync:    wait at sync %.2f ms, batches/window fast %.1f slow %.1f, %.3f s",
		syncE.WaitAtSyncMS, syncE.Ranks[0].BatchesPerWindow, syncE.Ranks[1].BatchesPerWindow, syncE.Seconds)
	t.Logf("cadence: wait at sync %.2f ms, batches/window fast %.1f slow %.1f, %.3f s",
		cadE.WaitAtSyncMS, cadE.Ranks[0].BatchesPerWindow, cadE.Ranks[1].BatchesPerWindow, cadE.Seconds)
	if syncE.Ranks[0].BatchesPerWindow != syncE.Ranks[1].BatchesPerWindow {
		t.Errorf("sync gave the ranks different windows: %+v", syncE.Ranks)
	}
	if cadE.Ranks[0].BatchesPerWindow < 2*cadE.Ranks[1].BatchesPerWindow {
		t.Errorf("cadence: fast rank %.1f batches per window, slow rank %.1f: want the fast one doing at least twice as many",
			cadE.Ranks[0].BatchesPerWindow, cadE.Ranks[1].BatchesPerWindow)
	}
	if cadE.WaitAtSyncMS >= syncE.WaitAtSyncMS {
		t.Errorf("wait at sync: cadence %.2f ms, sync %.2f ms: want cadence lower", cadE.WaitAtSyncMS, syncE.WaitAtSyncMS)
	}
}

// Async: ranks stream chunks from a shared pool, so the fast rank trains
// more samples; rounds still happen and every sample is trained once.
func TestAsyncStreams(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.Policy = config.PolicyAsync
	cfg.Coordinator.SyncEvery = 4
	h := newHarness(t, cfg, nil)
	h.startAll(func(r uint32) rankScript {
		return rankScript{msPerBatch: time.Duration(1+3*r) * time.Millisecond, samples: 480}
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, 480)
	for _, e := range sum.Epochs {
		if e.Rounds < 2 {
			t.Errorf("epoch %d: %d rounds, want several", e.Epoch, e.Rounds)
		}
		if e.Ranks[0].Samples <= e.Ranks[2].Samples {
			t.Errorf("epoch %d: fast rank trained %d samples, slow rank %d", e.Epoch, e.Ranks[0].Samples, e.Ranks[2].Samples)
		}
	}
}

// A rank that sends Exiting in the middle of training has left, not died:
// its samples still move to the others.
func TestExitingMidRunIsNotDeath(t *testing.T) {
	cfg := testConfig(t)
	cfg.Run.Epochs = 1
	h := newHarness(t, cfg, nil)
	h.startAll(func(r uint32) rankScript {
		if r == 1 {
			return rankScript{msPerBatch: 2 * time.Millisecond, exitAfterBatches: 2}
		}
		return rankScript{msPerBatch: 2 * time.Millisecond}
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 1, 96)
	if len(sum.MembershipEvents) != 1 || sum.MembershipEvents[0].Event != "left" || sum.Ranks[1].State != record.RankExited {
		t.Errorf("events %+v, rank 1 %+v: want one 'left' and state exited", sum.MembershipEvents, sum.Ranks[1])
	}
}

// sumRanges is the number of samples in rs.
func sumRanges(rs []dispatch.Range) uint64 {
	var n uint64
	for _, r := range rs {
		n += r.Size
	}
	return n
}
