package main

import (
	"path/filepath"
	"testing"
	"time"
)

// A trainer's scalars reach summary.json: the mock reports its learning
// rate as "lr" with every batch, and each epoch shows its mean.
func TestRunScalarsInSummary(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cfg := writeRunConfig(t, "", map[string]any{"samples": 256, "batch_size": 16, "lr": 0.25})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "2", "--out", out)
	if code := p.wait(120 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	sum := readSummary(t, out)
	if len(sum.Epochs) != 2 {
		t.Fatalf("%d epochs in the summary, want 2", len(sum.Epochs))
	}
	for _, e := range sum.Epochs {
		if len(e.Scalars) != 1 || e.Scalars["lr"] != 0.25 {
			t.Errorf("epoch %d scalars %v, want lr 0.25", e.Epoch, e.Scalars)
		}
	}
}
