package record

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/status"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// A run's finished epochs live in its out directory, not in the
// coordinator's memory, and everything that lists them (the summary, the
// record's Finished) still lists every one in order; the status page's
// curve stays bounded, always ends at the latest epoch, and a snapshot
// taken earlier (here at an epoch off the thinned curve's stride, which the
// next epoch replaces) is not changed by later epochs. Where the out directory
// cannot be written, the epochs are kept in memory, and nothing is lost.
func TestFinishedEpochsLiveOnDisk(t *testing.T) {
	for _, writable := range []bool{true, false} {
		t.Run(map[bool]string{true: "out directory", false: "unwritable out directory"}[writable], func(t *testing.T) {
			out := t.TempDir()
			if !writable {
				out = filepath.Join(out, "gone")
			}
			if writable {
				// An earlier run into the same directory left its epochs.
				if err := os.WriteFile(filepath.Join(out, EpochsFile), []byte("{\"epoch\": 99}\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var snaps []*status.Snapshot
			src := &fixed{}
			r := New(Config{Out: out, RunID: "r", World: 2, Policy: "sync", Epochs: 3000, Started: time.Now(),
				Source: src, Dispatch: src, Bulk: src, Publish: func(s *status.Snapshot) { snaps = append(snaps, s) },
				Logger: hclog.NewNullLogger()})
			const n = 3000
			var early []status.EpochPoint
			var atOdd *status.Snapshot
			for e := range uint64(n) {
				r.StartEpoch(e, EpochProgress{})
				r.Metrics(0, &wirepb.Metrics{Samples: 64, Batches: 1, AvgLoss: 1 / float64(e+1)})
				r.EndEpoch()
				if e+1 == 1501 {
					r.Publish(true)
					atOdd = snaps[len(snaps)-1]
					early = slices.Clone(atOdd.EpochCurve)
				}
			}
			r.Publish(true)
			eps, err := Epochs(r.Finished())
			if err != nil || len(eps) != n {
				t.Fatalf("finished epochs: %d, %v; want %d", len(eps), err, n)
			}
			for i, e := range eps {
				if e.Epoch != uint64(i+1) || e.Samples != 64 {
					t.Fatalf("finished epoch %d reads %+v", i+1, e)
				}
			}
			if sum := r.Summary(); len(sum.Epochs) != n || sum.Epochs[n-1].Epoch != n {
				t.Fatalf("summary: %d epochs", len(sum.Epochs))
			}
			lines, err := os.ReadFile(filepath.Join(out, EpochsFile))
			if got := bytes.Count(lines, []byte("\n")); writable && (err != nil || got != n) {
				t.Fatalf("%s: %d lines (%v), want %d", EpochsFile, got, err, n)
			}
			if writable {
				r.NoteEpoch(eps[n-1])
				back, err := ReadSummary(filepath.Join(out, SummaryFile))
				if err != nil || len(back.Epochs) != n || back.Epochs[n-1].Loss != eps[n-1].Loss {
					t.Fatalf("summary.json: %v, %v", back, err)
				}
			}

			curve := snaps[len(snaps)-1].EpochCurve
			if len(curve) > maxEpochPoints || len(curve) < maxEpochPoints/2 || curve[len(curve)-1].Epoch != n {
				t.Fatalf("the page's curve holds %d points ending at epoch %d; want at most %d, at least half that, ending at %d",
					len(curve), curve[len(curve)-1].Epoch, maxEpochPoints, n)
			}
			if !slices.IsSortedFunc(curve, func(a, b status.EpochPoint) int { return int(a.Epoch) - int(b.Epoch) }) {
				t.Fatal("the page's curve is out of order")
			}
			if len(early) == 0 || early[len(early)-1].Epoch != 1501 {
				t.Fatalf("the snapshot at epoch 1501 ends at %v", early)
			}
			if !slices.EqualFunc(atOdd.EpochCurve, early, func(a, b status.EpochPoint) bool { return a.Epoch == b.Epoch && a.Loss == b.Loss }) {
				t.Fatal("later epochs changed the snapshot taken at epoch 1501")
			}

			// A resumed run's record starts from the epochs it inherits.
			r2 := New(Config{Out: out, RunID: "r", World: 2, Policy: "sync", Epochs: 3000, Started: time.Now(),
				Source: src, Dispatch: src, Bulk: src, Publish: func(*status.Snapshot) {}, Logger: hclog.NewNullLogger()})
			r2.Resumed(5, eps[:10])
			if got, err := Epochs(r2.Finished()); err != nil || len(got) != 10 || got[9].Epoch != 10 {
				t.Fatalf("resumed: %d epochs, %v", len(got), err)
			}
		})
	}
}
