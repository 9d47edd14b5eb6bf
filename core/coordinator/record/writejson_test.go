package record

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
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
		if err := writeSummary(streamed, s); err != nil {
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
		if err := WriteJSONEpochs(path, v, "epochs", EpochList(es)); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}

// Rewriting a summary allocates little per epoch it holds: the epochs are
// encoded into reused buffers. MarshalIndent per epoch allocated about
// twice each epoch's bytes, so a long run's every rewrite raised its peak
// heap.
func TestWriteSummaryGarbageDoesNotGrowWithEpochs(t *testing.T) {
	acc := 0.85
	dir := t.TempDir()
	written := func(n int) (alloc uint64, size int64) {
		s := &Summary{Status: StatusRunning, RunID: "r", WorldSize: 4, Epochs: []EpochSummary{}}
		for i := range n {
			s.Epochs = append(s.Epochs, EpochSummary{Epoch: uint64(i + 1), Loss: 0.3, Accuracy: &acc, Samples: 60000,
				Ranks:   []EpochRank{{Rank: 0, Batches: 234}, {Rank: 1, Batches: 234}, {Rank: 2, Batches: 234}, {Rank: 3, Batches: 234}},
				Scalars: map[string]float64{"lr": 0.1}})
		}
		path := filepath.Join(dir, "summary.json")
		if err := writeSummary(path, s); err != nil { // warm the encoder's caches
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if err := writeSummary(path, s); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return after.TotalAlloc - before.TotalAlloc, fi.Size()
	}
	a10, s10 := written(10)
	a400, s400 := written(400)
	perEpoch := float64(a400-min(a10, a400)) / 390
	epochBytes := float64(s400-s10) / 390
	// MarshalIndent made two copies of each epoch (about 1.9 times its
	// JSON here); the encoder makes none, but under the race detector,
	// whose sync.Pool drops buffers at random, its pooled buffer is at
	// times made again (about 1 time its JSON).
	if perEpoch > 1.5*epochBytes {
		t.Fatalf("a rewrite allocates %.0f bytes more per epoch it holds (%d bytes for 10 epochs, %d for 400), against %.0f bytes of JSON an epoch; want under 1.5 times that",
			perEpoch, a10, a400, epochBytes)
	}
}

// writeSummary writes s to path as WriteJSON does, its epochs one by one
// (WriteJSONEpochs), as the Recorder rewrites summary.json every epoch.
func writeSummary(path string, s *Summary) error {
	head := *s
	head.Epochs = s.Epochs[:0:0] // null or [], as s has it
	return WriteJSONEpochs(path, &head, "epochs", EpochList(s.Epochs))
}
