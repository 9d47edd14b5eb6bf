package coordinator

import (
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// lostTrainings lists, per epoch, the positions f trained that died with
// it (trained after the last round it completed).
func lostTrainings(l *ledger, f *fakeRank) map[uint64][]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[uint64][]uint64{}
	for e, m := range l.seen {
		for p, trs := range m {
			for _, tr := range trs {
				if tr.f == f && lostWithRank(tr) {
					out[e] = append(out[e], p)
				}
			}
		}
	}
	return out
}

// A rank that dies mid-window takes with it what it trained since the
// last round that averaged its work: each of those samples is trained
// again by exactly one survivor, nothing is missing, and the summary
// counts every sample of the epoch once, under every policy.
func TestDeadRanksUnaveragedWorkTrainedAgain(t *testing.T) {
	for _, policy := range []config.Policy{config.PolicySync, config.PolicyCadence, config.PolicyAsync} {
		t.Run(string(policy), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.Policy = policy
			cfg.Coordinator.HeartbeatTimeout = time.Second
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(func(r uint32) rankScript {
				s := rankScript{msPerBatch: 5 * time.Millisecond}
				if r == 2 {
					s.dieAfterBatches = 3
				}
				return s
			})
			sum := h.mustComplete()
			lost := lostTrainings(h.ledger, ranks[2])
			if len(lost[0]) == 0 {
				t.Fatal("rank 2 died with nothing unaveraged: the test shows nothing")
			}
			t.Logf("rank 2 died with %d samples of epoch 1 unaveraged", len(lost[0]))
			h.ledger.mu.Lock()
			for _, p := range lost[0] {
				var again []uint32
				for _, tr := range h.ledger.seen[0][p] {
					if tr.f != ranks[2] {
						again = append(again, tr.f.id)
					}
				}
				if len(again) != 1 {
					t.Errorf("position %d, lost with rank 2, was trained again by ranks %v; want one survivor", p, again)
				}
			}
			h.ledger.mu.Unlock()
			h.ledger.checkExactlyOnce(t, 2, 96)
			checkShares(t, sum, 96)
			if d := sum.Ranks[2].Death; d == nil || sumRanges(d.Unfinished) < uint64(len(lost[0])) {
				t.Errorf("death record %+v: its unfinished work must include the %d lost samples", d, len(lost[0]))
			}
		})
	}
}

// checkShares fails t unless every epoch of sum counts samples, and its
// ranks' shares add up to that.
func checkShares(t *testing.T, sum *record.Summary, samples uint64) {
	t.Helper()
	for _, e := range sum.Epochs {
		var shares uint64
		for _, r := range e.Ranks {
			shares += r.Samples
		}
		if e.Samples != samples || shares != samples {
			t.Errorf("epoch %d: %d samples, the ranks' shares sum to %d; want %d", e.Epoch, e.Samples, shares, samples)
		}
	}
}

// A save forced by a failure (a death below min_ranks) between rounds
// records what the saved models hold: the resumed run starts from the
// lowest saved rank's model, which holds what that rank trained since the
// last round, so those samples are not trained again; what the other
// ranks trained since (their models are replaced by it) is. Across both
// runs every sample is in the final model exactly once per epoch, and the
// resumed summary's figures add up.
func TestFailureSaveResumesExactlyOnce(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.MinRanks = 3
	cfg.Coordinator.HeartbeatTimeout = time.Second
	h1 := newHarness(t, cfg, nil)
	ranks := h1.startAll(func(r uint32) rankScript {
		s := rankScript{msPerBatch: 5 * time.Millisecond}
		if r == 2 {
			s.dieAfterBatches = 3
		}
		return s
	})
	sum1, _ := h1.wait()
	if sum1 == nil || sum1.Status != record.StatusFailed || sum1.Checkpoint == "" {
		t.Fatalf("first run: %s, checkpoint %q; want failed with a save", statusOf(sum1), sum1.Checkpoint)
	}
	meta, err := checkpoint.ReadMeta(sum1.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Reason != checkpoint.ReasonTooFewRanks || meta.SavedRanks[0] != 0 {
		t.Fatalf("meta: reason %q, saved %v; want too_few_ranks saved by rank 0 first", meta.Reason, meta.SavedRanks)
	}
	// lost: trainings of the first run that the resumed run's model does
	// not hold (rank 0's are all in its saved model).
	lost := func(tr training) bool {
		if tr.f.h != h1 || tr.f == ranks[0] {
			return false
		}
		tr.f.mu.Lock()
		defer tr.f.mu.Unlock()
		return tr.rounds >= tr.f.roundsDone
	}
	var held0 uint64
	h1.ledger.mu.Lock()
	for _, trs := range h1.ledger.seen[0] {
		for _, tr := range trs {
			ranks[0].mu.Lock()
			if tr.f == ranks[0] && tr.rounds >= ranks[0].roundsDone {
				held0++
			}
			ranks[0].mu.Unlock()
		}
	}
	h1.ledger.mu.Unlock()
	if held0 == 0 {
		t.Fatal("rank 0 trained nothing after its last round before the save: the test shows nothing")
	}
	t.Logf("rank 0's saved model holds %d samples beyond the last round", held0)
	if got := meta.Partial.Ranks[0].Samples; meta.Partial.Samples == 0 || got == 0 {
		t.Errorf("meta partial %+v: want rank 0's samples beyond the round counted", meta.Partial)
	}

	h2 := newHarness(t, cfg, func(o *Options) { o.Resume = h1.out; o.Out = h1.out })
	h2.ledger = h1.ledger
	h2.startAll(nil)
	sum2 := h2.mustComplete()
	h2.ledger.checkHeld(t, 0, 2, 96, lost)
	checkShares(t, sum2, 96)
}
