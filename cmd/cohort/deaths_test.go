package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// checkDeathRecord: a rank killed mid-run in a run that completed has its
// death record in summary.json and in OUT/deaths, the same, and every
// sample taken back from it went to a survivor.
func checkDeathRecord(t *testing.T, out string, sum *record.Summary, rank uint32) {
	t.Helper()
	d := sum.Ranks[rank].Death
	if d == nil {
		t.Fatalf("rank %d has no death record in the summary", rank)
	}
	if d.Rank != rank || d.RunID != sum.RunID || d.Reason != sum.Ranks[rank].Reason || d.Batches != sum.Ranks[rank].Batches {
		t.Errorf("death record %+v, want rank %d of run %s, dead of %q after %d batches", d, rank, sum.RunID, sum.Ranks[rank].Reason, sum.Ranks[rank].Batches)
	}
	var taken, handed uint64
	for _, r := range d.Unfinished {
		taken += r.Size
	}
	for _, h := range d.Redistributed {
		handed += h.Size
		if h.Rank == rank || sum.Ranks[h.Rank].State != record.RankExited {
			t.Errorf("%v went to rank %d, not a survivor", h.Range, h.Rank)
		}
	}
	if taken != handed {
		t.Errorf("%d samples taken back from rank %d, %d handed to survivors", taken, rank, handed)
	}
	t.Logf("death record: %+v", *d)
	b, err := os.ReadFile(filepath.Join(out, record.DeathsDir, fmt.Sprintf("rank-%d.json", rank)))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk record.DeathRecord
	if err := json.Unmarshal(b, &onDisk); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&onDisk, d) {
		t.Errorf("the death record file holds %+v, the summary %+v", onDisk, *d)
	}
}
