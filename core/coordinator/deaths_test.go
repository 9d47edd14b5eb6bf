package coordinator

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// A rank declared dead leaves a death record, in summary.json's rank and in
// OUT/deaths/rank-<N>.json: why and when, what it had trained, the work
// taken back from it and the survivors that got it. Rank 2 owns [64, 96)
// of each epoch in plans of 16 samples, batches of 8: three batches in, it
// has trained [80, 88) of its second plan since the round that averaged
// its first, which dies with it, and holds [88, 96) untrained: all of
// [80, 96) is taken back. A rank that leaves with Exiting leaves no record.
func TestDeathRecord(t *testing.T) {
	untrained := []dispatch.Range{{Offset: 80, Size: 16}}
	cases := []struct {
		name     string
		script   rankScript
		minRanks int
		reason   string // "": no record
		// handed is where the untrained work went; none when the run
		// saves instead.
		handed []dispatch.Handoff
	}{
		{
			name:   "link breaks mid-plan",
			script: rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3},
			reason: "link closed without Exiting",
			handed: []dispatch.Handoff{{Rank: 0, Range: dispatch.Range{Offset: 80, Size: 8}}, {Rank: 1, Range: dispatch.Range{Offset: 88, Size: 8}}},
		},
		{
			name:   "falls silent mid-plan",
			script: rankScript{msPerBatch: 5 * time.Millisecond, silentAfterBatches: 3},
			reason: "silent for 1s (heartbeat timeout)",
			handed: []dispatch.Handoff{{Rank: 0, Range: dispatch.Range{Offset: 80, Size: 8}}, {Rank: 1, Range: dispatch.Range{Offset: 88, Size: 8}}},
		},
		{
			name:     "below min_ranks",
			script:   rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3},
			minRanks: 3,
			reason:   "link closed without Exiting",
		},
		{
			name:   "exits mid-plan",
			script: rankScript{msPerBatch: 5 * time.Millisecond, exitAfterBatches: 3},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.HeartbeatTimeout = time.Second
			if tc.minRanks > 0 {
				cfg.Coordinator.MinRanks = tc.minRanks
			}
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(func(r uint32) rankScript {
				if r == 2 {
					return tc.script
				}
				return rankScript{msPerBatch: 5 * time.Millisecond}
			})
			sum, _ := h.wait()
			if sum == nil {
				t.Fatal("no summary")
			}
			for _, r := range sum.Ranks[:2] {
				if r.Death != nil {
					t.Errorf("survivor %d has a death record %+v", r.Rank, r.Death)
				}
			}
			file := filepath.Join(h.out, record.DeathsDir, "rank-2.json")
			d := sum.Ranks[2].Death
			if tc.reason == "" {
				if _, err := os.Stat(filepath.Join(h.out, record.DeathsDir)); d != nil || !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("a rank that exited left death record %+v (deaths directory: %v)", d, err)
				}
				return
			}
			if d == nil {
				t.Fatal("no death record in the summary")
			}
			if d.RunID != h.coord.RunID() || d.Rank != 2 || d.Epoch != 1 || d.Phase != "training" || d.Reason != tc.reason || d.Time.IsZero() {
				t.Errorf("record %+v: want this run's rank 2, epoch 1, training, %q", d, tc.reason)
			}
			if d.Batches != 3 || d.Samples != 24 || d.StepCount != 3 {
				t.Errorf("record says %d batches, %d samples, step %d; want 3, 24, 3", d.Batches, d.Samples, d.StepCount)
			}
			if !reflect.DeepEqual(d.Unfinished, untrained) {
				t.Errorf("unfinished %v, want %v", d.Unfinished, untrained)
			}
			if tc.handed == nil {
				tc.handed = []dispatch.Handoff{}
			}
			if !reflect.DeepEqual(d.Redistributed, tc.handed) {
				t.Errorf("redistributed %v, want %v", d.Redistributed, tc.handed)
			}
			// Each piece is what its survivor then trained as an extension.
			for _, hd := range d.Redistributed {
				f := ranks[hd.Rank]
				f.mu.Lock()
				found := false
				for _, p := range f.plans {
					found = found || p.via == "ext" && p.epoch == 0 && p.offset == hd.Offset && p.size == hd.Size
				}
				f.mu.Unlock()
				if !found {
					t.Errorf("rank %d trained no extension %v", hd.Rank, hd.Range)
				}
			}
			if tc.minRanks == 0 {
				h.ledger.checkExactlyOnce(t, 2, 96)
			}

			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("no death record file: %v", err)
			}
			var onDisk record.DeathRecord
			if err := json.Unmarshal(b, &onDisk); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(&onDisk, d) {
				t.Errorf("%s holds %+v, the summary %+v", file, onDisk, *d)
			}
		})
	}
}
