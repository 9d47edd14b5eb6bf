package coordinator

import (
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Async rounds (but round 0, which makes the ranks equal) may run beside
// training, and the ranks are told so at admission; async_overlap = false
// and the other policies keep every round blocking. Every sample is still
// trained once.
func TestAsyncRoundsOverlap(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  config.Policy
		overlap bool
		want    bool
	}{
		{"async", config.PolicyAsync, true, true},
		{"async, overlap off", config.PolicyAsync, false, false},
		{"sync", config.PolicySync, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.Policy = tc.policy
			cfg.Coordinator.AsyncOverlap = tc.overlap
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(func(uint32) rankScript { return rankScript{msPerBatch: time.Millisecond, samples: 480} })
			h.mustComplete()
			h.ledger.checkExactlyOnce(t, 2, 480)
			for _, f := range ranks {
				if got := f.admit.GetOverlapRounds(); got != tc.want {
					t.Errorf("rank %d: Admit.overlap_rounds %v, want %v", f.id, got, tc.want)
				}
				syncs := messagesOf[*wirepb.Sync](f)
				if len(syncs) < 2 {
					t.Fatalf("rank %d: %d Syncs", f.id, len(syncs))
				}
				if syncs[0].GetOverlap() {
					t.Errorf("rank %d: round 0 may run beside training", f.id)
				}
				for _, s := range syncs[1:] {
					if s.GetOverlap() != tc.want {
						t.Errorf("rank %d: round %d overlap %v, want %v", f.id, s.GetRound(), s.GetOverlap(), tc.want)
						break
					}
				}
			}
		})
	}
}
