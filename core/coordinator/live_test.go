package coordinator

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/status"
)

// TestLiveRecords: while the run trains, summary.json is rewritten after
// each epoch (status running, the epochs so far) and the snapshot moves;
// at the end metrics.jsonl holds a line per round and per epoch, agreeing
// with the summary, curves.png exists, and the last snapshot says how the
// run ended.
func TestLiveRecords(t *testing.T) {
	cfg := testConfig(t)
	var mu sync.Mutex
	var midRun *record.Summary
	var snaps []*status.Snapshot
	var h *harness
	h = newHarness(t, cfg, func(o *Options) {
		o.Progress = func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			snaps = append(snaps, h.coord.Status())
			if p.Kind == ProgressEpoch && p.Summary.Epoch == 2 {
				// Epoch 1's rewrite is on disk; epoch 2's comes after this call
				// (epochs are numbered from 1 in the summary).
				s, err := record.ReadSummary(filepath.Join(h.out, record.SummaryFile))
				if err != nil {
					t.Errorf("summary.json during the run: %v", err)
					return
				}
				midRun = s
			}
		}
	})
	h.startAll(func(uint32) rankScript { return rankScript{msPerBatch: time.Millisecond} })
	sum := h.mustComplete()

	if midRun == nil {
		t.Fatal("no summary.json read between the epochs")
	}
	if midRun.Status != record.StatusRunning || len(midRun.Epochs) != 1 || midRun.Epochs[0].Epoch != 1 {
		t.Errorf("summary.json after epoch 1: status %q, %d epochs; want running with epoch 1", midRun.Status, len(midRun.Epochs))
	}
	for _, r := range midRun.Ranks {
		if r.State != record.RankLive {
			t.Errorf("summary.json after epoch 1: rank %d %q, want live", r.Rank, r.State)
		}
	}

	f, err := os.Open(filepath.Join(h.out, record.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rounds, epochs int
	var lastRound uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Kind  string   `json:"kind"`
			Round uint64   `json:"round"`
			Epoch uint64   `json:"epoch"`
			Loss  *float64 `json:"loss"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("metrics.jsonl line %q: %v", sc.Text(), err)
		}
		switch line.Kind {
		case "round":
			if rounds > 0 && line.Round != lastRound+1 {
				t.Errorf("round %d follows round %d", line.Round, lastRound)
			}
			if line.Round > 0 && line.Loss == nil {
				t.Errorf("round %d has no loss", line.Round)
			}
			lastRound = line.Round
			rounds++
		case "epoch":
			if line.Epoch != uint64(epochs)+1 {
				t.Errorf("epoch line %d, want %d (from 1, as in the summary)", line.Epoch, epochs+1)
			}
			epochs++
		default:
			t.Errorf("metrics.jsonl line of kind %q", line.Kind)
		}
	}
	if uint64(rounds) != sum.Averaging.Rounds || epochs != len(sum.Epochs) {
		t.Errorf("metrics.jsonl: %d rounds, %d epochs; the summary says %d, %d", rounds, epochs, sum.Averaging.Rounds, len(sum.Epochs))
	}
	if st, err := os.Stat(filepath.Join(h.out, status.CurvesFile)); err != nil || st.Size() == 0 {
		t.Errorf("curves.png: %v", err)
	}

	final := h.coord.Status()
	if final.Status != record.StatusCompleted || len(final.EpochCurve) != 2 || final.Totals.Rounds != sum.Averaging.Rounds {
		t.Errorf("final snapshot: status %q, %d epochs, %d rounds", final.Status, len(final.EpochCurve), final.Totals.Rounds)
	}
	if final.Totals.Batches == 0 || final.Totals.Samples == 0 || final.RoundSeconds.Count != final.Totals.Rounds {
		t.Errorf("final totals %+v, histogram count %d", final.Totals, final.RoundSeconds.Count)
	}
	for _, r := range final.Ranks {
		if r.State != record.RankExited || r.Batches == 0 || r.LastHeard.IsZero() {
			t.Errorf("final rank %+v", r)
		}
	}
	// Snapshots published earlier are untouched by what came after.
	mu.Lock()
	defer mu.Unlock()
	var grew bool
	for i := 1; i < len(snaps); i++ {
		a, b := snaps[i-1], snaps[i]
		if a == nil || b == nil {
			continue
		}
		if len(a.RoundCurve) > len(b.RoundCurve) && len(b.RoundCurve) < status.MaxRounds {
			t.Errorf("round curve shrank from %d to %d", len(a.RoundCurve), len(b.RoundCurve))
		}
		grew = grew || b.Totals.Samples > a.Totals.Samples
	}
	if !grew {
		t.Error("no snapshot during the run shows more samples than the one before")
	}
}
