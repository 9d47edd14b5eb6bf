package coordinator

import (
	"fmt"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Ranks exchange blobs through the coordinator while they set up: each
// exchange completes for every rank with every rank's blob, before Ready.
func TestRelayThroughCoordinator(t *testing.T) {
	cfg := testConfig(t)
	cfg.Run.Ranks, cfg.Run.Epochs = 3, 1
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(uint32) rankScript {
		return rankScript{meet: plugin.MeetRelay, relayKeys: []string{"nccl-id/0", "addresses"}, msPerBatch: time.Millisecond}
	})
	h.mustComplete()
	for _, f := range ranks {
		got := messagesOf[*wirepb.RelayResult](f)
		if len(got) != 2 {
			t.Fatalf("rank %d: %d relay results, want 2", f.id, len(got))
		}
		for _, res := range got {
			if res.GetError() != "" || len(res.GetBlobs()) != 3 {
				t.Fatalf("rank %d: result %v, want 3 blobs", f.id, res)
			}
			for i, b := range res.GetBlobs() {
				if want := fmt.Sprintf("%s@%d", res.GetKey(), i); b.GetRank() != uint32(i) || string(b.GetBlob()) != want {
					t.Errorf("rank %d key %s: blob %d is rank %d's %q, want %q", f.id, res.GetKey(), i, b.GetRank(), b.GetBlob(), want)
				}
			}
		}
	}
}
