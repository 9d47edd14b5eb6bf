package main

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// A run saves after every epoch by default and keeps the newest
// checkpoint_keep, so `cohort run` SIGKILLed mid-epoch 3 (no chance to
// save) resumes at epoch 3's start: the crash costs that epoch's work
// alone, and the resumed run completes.
func TestRunKilledMidEpochResumesAtItsStart(t *testing.T) {
	trainer := map[string]any{"samples": 1024, "batch_size": 16, "sleep_per_batch": "5ms"}
	cfg := writeRunConfig(t, "coordinator {\n  checkpoint_keep = 2\n}\n", trainer)
	out := filepath.Join(t.TempDir(), "out")
	p := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "5", "--out", out)
	p.waitLine("checkpoint ", 60*time.Second) // after epoch 1
	p.waitLine("checkpoint ", 60*time.Second) // after epoch 2
	time.Sleep(50 * time.Millisecond)         // into epoch 3: 32 batches of 5 ms a rank
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(30 * time.Second)
	dir := filepath.Join(out, checkpoint.CheckpointsDir)
	last, err := checkpoint.LastCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := checkpoint.ReadMeta(last)
	if err != nil {
		t.Fatal(err)
	}
	// meta.json's epoch is the index from 0 of the epoch to train next.
	if meta.Epoch != 2 || len(meta.Finished) != 2 {
		t.Fatalf("last checkpoint %s: resumes at epoch index %d with %d epochs finished; want epoch 3 (index 2) after 2",
			last, meta.Epoch, len(meta.Finished))
	}
	if code := startCohort(t, "run", "--resume", out).wait(120 * time.Second); code != 0 {
		t.Fatalf("resumed run: exit %d", code)
	}
	sum := readSummary(t, out)
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != 5 || sum.ResumedFrom != last {
		t.Fatalf("resumed run: status %s, %d epochs, resumed from %q (want %q)", sum.Status, len(sum.Epochs), sum.ResumedFrom, last)
	}
	// checkpoint_keep = 2: the resumed run's last two epochs' checkpoints.
	kept, _ := filepath.Glob(filepath.Join(dir, "ckpt-*"))
	if len(kept) != 2 || kept[1] != sum.Checkpoint {
		t.Errorf("checkpoints kept %v, want 2 ending with %s", kept, sum.Checkpoint)
	}
}
