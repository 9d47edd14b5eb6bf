package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/wire"
)

// `cohort run` starts a coordinator in place of one that crashed, on its
// address and resuming its run, up to coordinatorRestarts times; a run
// that failed, or a coordinator that crashed once too often, ends the run.
func TestComeBackReplacesACrashedCoordinator(t *testing.T) {
	crashed := fmt.Errorf("%w: a bug\nstack", coordinator.ErrCrashed)
	for _, tc := range []struct {
		name     string
		err      error
		restarts int
		want     bool
	}{
		{"crashed", crashed, 0, true},
		{"crashed once too often", crashed, coordinatorRestarts, false},
		{"the run failed", errors.New("coordinator: every rank is lost"), 0, false},
		{"completed", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Run.Out = t.TempDir()
			keys, err := wire.DeriveKeys([]byte("comeback-test-secret-0123456789abcdef"))
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			opts := coordinator.Options{Config: cfg, Keys: keys, Listener: ln}
			prev, err := coordinator.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			prev.Close() // as a crashed Run leaves it: its address free
			// and the consensus file of its last round.
			w, _, err := checkpoint.Open(filepath.Join(prev.Out(), checkpoint.CheckpointsDir), checkpoint.Run{RunID: prev.RunID(),
				Seed: cfg.Run.Seed, World: uint32(cfg.Run.Ranks), Policy: string(cfg.Coordinator.Policy), Epochs: cfg.Run.Epochs}, 3, hclog.NewNullLogger())
			if err != nil {
				t.Fatal(err)
			}
			live := []uint32{0, 1, 2, 3}
			snap := dispatch.Snapshot{Remaining: map[uint32][]dispatch.Range{}}
			for _, r := range live {
				snap.Remaining[r] = []dispatch.Range{{Offset: 25 * uint64(r), Size: 25}}
			}
			last := checkpoint.ConsensusAt{Round: 3, Progress: checkpoint.Progress{Snapshot: snap}, Totals: checkpoint.Totals{PickSpace: 100}}
			if err := w.WriteConsensus(last, nil, live, 4); err != nil {
				t.Fatal(err)
			}
			restarts := tc.restarts
			next := comeBack(opts, prev, tc.err, &restarts, newProgressPrinter(io.Discard, false, progressEvery))
			if (next != nil) != tc.want {
				t.Fatalf("comeBack = %v, want a coordinator: %v", next, tc.want)
			}
			if next == nil {
				return
			}
			defer next.Close()
			if next.Addr().String() != prev.Addr().String() || next.Out() != prev.Out() || next.RunID() != prev.RunID() || restarts != tc.restarts+1 {
				t.Errorf("the new coordinator listens on %s for %s, run %s (restart %d); the crashed one on %s for %s, run %s",
					next.Addr(), next.Out(), next.RunID(), restarts, prev.Addr(), prev.Out(), prev.RunID())
			}
		})
	}
}
