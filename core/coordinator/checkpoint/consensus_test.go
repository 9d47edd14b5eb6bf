package checkpoint

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/hashicorp/go-hclog"
)

// The consensus file keeps what a coordinator that comes back needs: the
// last round's state and the pending one's, each with the finished epochs
// (kept in a file of their own, rewritten only when one finishes), and it
// is gone once the run ends.
func TestConsensusFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w, _, err := Open(dir, Run{RunID: "r1", Seed: 3, World: 2, Policy: "sync", Epochs: 4}, 3, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	progress := func(off uint64) Progress {
		return Progress{Snapshot: dispatch.Snapshot{Epoch: 1, Remaining: map[uint32][]dispatch.Range{
			0: {{Offset: off, Size: 50 - off}}, 1: {{Offset: 50 + off, Size: 50 - off}}}}}
	}
	one := []record.EpochSummary{{Epoch: 1, Samples: 100}}
	totals := Totals{PickSpace: 100, BatchSize: 10, Rounds: 7, GlobalStep: 9, Finished: record.EpochList(one)}
	pend := ConsensusAt{Round: 8, Progress: progress(20), Totals: totals}
	if err := w.WriteConsensus(ConsensusAt{Round: 7, Progress: progress(10), Totals: totals}, &pend, []uint32{0, 1}, 9); err != nil {
		t.Fatal(err)
	}
	c, err := ReadConsensus(dir)
	if err != nil || c == nil {
		t.Fatalf("ReadConsensus: %v, %v", c, err)
	}
	if c.Round != 7 || c.NextRound != 9 || !slices.Equal(c.Live, []uint32{0, 1}) || c.Last.RunID != "r1" || len(c.Last.Finished) != 1 {
		t.Errorf("read %+v", c)
	}
	for _, tc := range []struct {
		round uint64
		left  uint64 // rank 0's first remaining offset
		ok    bool
	}{{7, 10, true}, {8, 20, true}, {6, 0, false}} {
		m, ok := c.State(tc.round)
		if ok != tc.ok || ok && (m.Remaining[0].Ranges[0].Offset != tc.left || len(m.Finished) != 1) {
			t.Errorf("State(%d) = %+v, %v; want rank 0 from %d: %v", tc.round, m, ok, tc.left, tc.ok)
		}
	}
	// An epochs file ahead of the state (the run died between the two
	// writes) gives the state only the epochs it had.
	before, err := os.ReadFile(filepath.Join(dir, ConsensusFile))
	if err != nil {
		t.Fatal(err)
	}
	two := append(slices.Clone(one), record.EpochSummary{Epoch: 2, Samples: 100})
	if err := w.WriteConsensus(ConsensusAt{Round: 9, Progress: progress(0), Totals: Totals{PickSpace: 100, Finished: record.EpochList(two)}}, nil, []uint32{0, 1}, 10); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConsensusFile), before, 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := ReadConsensus(dir); err != nil || len(c.Last.Finished) != 1 || c.Round != 7 {
		t.Errorf("a state of 1 epoch beside an epochs file of 2: %+v, %v", c, err)
	}
	// A file that says more epochs than its epochs file holds, or fewer
	// than none, is refused, not read.
	for _, n := range []string{"-1", "3"} {
		bad := []byte(strings.Replace(string(before), `"finished":1`, `"finished":`+n, 1))
		if err := os.WriteFile(filepath.Join(dir, ConsensusFile), bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if c, err := ReadConsensus(dir); err == nil {
			t.Errorf("a consensus file of %s finished epochs beside 2 read as %+v", n, c)
		}
	}
	if err := w.RemoveConsensus(); err != nil {
		t.Fatal(err)
	}
	if c, err := ReadConsensus(dir); c != nil || err != nil {
		t.Errorf("after RemoveConsensus: %+v, %v", c, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("left in the checkpoints directory: %v", left)
	}
}

// Holds takes what a kept model holds out of the remaining work and
// counts it as that rank's.
func TestMetaHolds(t *testing.T) {
	m := Meta{Epoch: 2, Remaining: []dispatch.RankRanges{{Rank: 0, Ranges: []dispatch.Range{{Offset: 0, Size: 50}}}, {Rank: 1, Ranges: []dispatch.Range{{Offset: 50, Size: 50}}}},
		Partial: record.EpochProgress{Samples: 0}}
	m.Holds(1, []dispatch.Span{{Epoch: 2, Range: dispatch.Range{Offset: 50, Size: 20}, Batches: 2}, {Epoch: 1, Range: dispatch.Range{Offset: 0, Size: 10}, Batches: 1}})
	if got := m.Remaining[1].Ranges; len(got) != 1 || got[0] != (dispatch.Range{Offset: 70, Size: 30}) {
		t.Errorf("rank 1 remaining %v, want [70, +30)", got)
	}
	if m.Partial.Samples != 20 || m.Partial.Batches != 2 || m.Partial.Ranks[1].Samples != 20 || len(m.Remaining[0].Ranges) != 1 {
		t.Errorf("partial %+v, remaining %+v: want rank 1's 20 samples of epoch 2 counted, rank 0 untouched", m.Partial, m.Remaining)
	}
}
