package coordinator

import (
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// An epoch's scalars are each name's mean over every batch report of every
// rank (Σ sums / Σ counts, not a mean of the ranks' means); names past
// plugin.MaxScalars, invalid names, empty or non-finite sums and counts
// above the plan's batches are dropped, with a warning. summary.json and
// the status snapshot carry them.
func TestEpochScalarsAcrossRanks(t *testing.T) {
	names := func(prefix string, n int, into map[string]*wirepb.ScalarSum) {
		for i := range n {
			into[fmt.Sprintf("%s%02d", prefix, i)] = &wirepb.ScalarSum{Sum: 1, Count: 1}
		}
	}
	// Each plan's lr: a sum over count of its batches.
	lr := map[uint32]*wirepb.ScalarSum{0: {Sum: 0.1, Count: 1}, 1: {Sum: 0.4, Count: 2}, 2: {Sum: 0.9, Count: 1}}
	junk := []string{"Bad Name", "nan", "empty", "over"}
	script := func(r uint32) rankScript {
		return rankScript{msPerBatch: 2 * time.Millisecond, scalars: func(nb uint64) map[string]*wirepb.ScalarSum {
			m := map[string]*wirepb.ScalarSum{"lr": lr[r]}
			switch r {
			case 1:
				names("a", 20, m)
			case 2:
				names("b", 20, m)
				m["Bad Name"] = &wirepb.ScalarSum{Sum: 1, Count: 1}
				m["nan"] = &wirepb.ScalarSum{Sum: math.NaN(), Count: 1}
				m["empty"] = &wirepb.ScalarSum{Sum: 5}
				m["over"] = &wirepb.ScalarSum{Sum: 1, Count: nb + 1}
			}
			return m
		}}
	}
	h := newHarness(t, testConfig(t), nil)
	ranks := h.startAll(script)
	sum := h.mustComplete()
	if len(sum.Epochs) != 2 {
		t.Fatalf("%d epochs, want 2", len(sum.Epochs))
	}
	for e, es := range sum.Epochs {
		var s, n float64
		for _, f := range ranks {
			f.mu.Lock()
			for _, p := range f.plans {
				if p.epoch == uint64(e) {
					s += lr[f.id].Sum
					n += float64(lr[f.id].Count)
				}
			}
			f.mu.Unlock()
		}
		if got, want := es.Scalars["lr"], s/n; math.Abs(got-want) > 1e-12 {
			t.Errorf("epoch %d: lr %v, want %v (Σ sums / Σ counts over the ranks' plans)", es.Epoch, got, want)
		}
		if len(es.Scalars) != plugin.MaxScalars {
			t.Errorf("epoch %d keeps %d scalars, want the limit %d of the 41 valid names", es.Epoch, len(es.Scalars), plugin.MaxScalars)
		}
		for name, v := range es.Scalars {
			if name != "lr" && v != 1 {
				t.Errorf("epoch %d: %s = %v, want 1", es.Epoch, name, v)
			}
		}
		for _, name := range junk {
			if _, ok := es.Scalars[name]; ok {
				t.Errorf("epoch %d kept %q", es.Epoch, name)
			}
		}
	}
	if !h.logHas("dropped trainer scalars", "rank=2") {
		t.Error("no warning about rank 2's dropped scalars")
	}
	onDisk, err := record.ReadSummary(filepath.Join(h.out, record.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	curve := h.coord.Status().EpochCurve
	for i, es := range sum.Epochs {
		if !maps.Equal(onDisk.Epochs[i].Scalars, es.Scalars) || !maps.Equal(curve[i].Scalars, es.Scalars) {
			t.Errorf("epoch %d: summary.json %v, status %v, want %v", es.Epoch, onDisk.Epochs[i].Scalars, curve[i].Scalars, es.Scalars)
		}
	}
}
