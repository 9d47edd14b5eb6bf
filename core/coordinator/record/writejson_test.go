package record

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A summary written epoch by epoch is the bytes of the summary written at
// once, however many epochs it holds.
func TestWriteSummaryMatchesWriteJSON(t *testing.T) {
	acc, eval := 0.85, 0.4
	epoch := func(i uint64) EpochSummary {
		e := EpochSummary{Epoch: i, Loss: 1 / float64(i), Seconds: 1.5, Samples: 60000, Windows: 24, Rounds: 24,
			Ranks: []EpochRank{{Rank: 0, Batches: 234, Samples: 15000}, {Rank: 1, Batches: 234, Samples: 15000, TrainMS: 9.5}}}
		if i%2 == 0 {
			e.Accuracy, e.EvalLoss = &acc, &eval
			e.Scalars = map[string]float64{"lr": 0.1, "grad_norm": 2}
		}
		return e
	}
	dir := t.TempDir()
	for _, n := range []uint64{0, 1, 2, 7} {
		s := &Summary{Status: StatusRunning, RunID: "r", WorldSize: 2, Started: time.Unix(5, 0).UTC(), Epochs: []EpochSummary{},
			Ranks: []RankSummary{{Rank: 0, State: RankLive}}, MembershipEvents: []MembershipEvent{}, Roles: []RoleElection{}}
		for i := uint64(1); i <= n; i++ {
			s.Epochs = append(s.Epochs, epoch(i))
		}
		whole, streamed := filepath.Join(dir, "whole.json"), filepath.Join(dir, "streamed.json")
		if err := WriteJSON(whole, s); err != nil {
			t.Fatal(err)
		}
		if err := WriteSummary(streamed, s); err != nil {
			t.Fatal(err)
		}
		a, _ := os.ReadFile(whole)
		b, _ := os.ReadFile(streamed)
		if !bytes.Equal(a, b) {
			t.Fatalf("%d epochs: written one by one\n%s\nwant\n%s", n, b, a)
		}
		back, err := ReadSummary(streamed)
		if err != nil || len(back.Epochs) != int(n) {
			t.Fatalf("%d epochs: read back %v, %v", n, back, err)
		}
	}
}

// The epochs go only where the document holds none.
func TestWriteJSONEpochsNeedsAnEmptyField(t *testing.T) {
	es := []EpochSummary{{Epoch: 1}}
	path := filepath.Join(t.TempDir(), "x.json")
	for name, v := range map[string]any{
		"no such field": struct {
			Other []int `json:"other"`
		}{},
		"field holds a value": struct {
			Epochs []EpochSummary `json:"epochs"`
		}{es},
		"only a nested field": struct {
			Inner struct {
				Epochs []int `json:"epochs"`
			} `json:"inner"`
		}{},
	} {
		if err := WriteJSONEpochs(path, v, "epochs", es); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}
