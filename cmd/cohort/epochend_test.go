package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The trainer's end-of-epoch code runs once per epoch, in order, on the
// rank the config elects for callbacks, and nowhere else.
func TestRunEpochEndOnTheCallbackRank(t *testing.T) {
	dir := t.TempDir()
	ends := filepath.Join(dir, "ends")
	cfg := writeRunConfig(t, "coordinator {\n  eval_rank = \"1\"\n}",
		map[string]any{"samples": 256, "batch_size": 16, "epoch_end_file": ends})
	out := filepath.Join(dir, "run")
	if code := startCohort(t, "run", "--config", cfg, "--ranks", "3", "--epochs", "3", "--out", out).wait(90 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	b, err := os.ReadFile(ends)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(b)), "1 0\n1 1\n1 2"; got != want {
		t.Errorf("end-of-epoch calls (rank epoch):\n%s\nwant:\n%s", got, want)
	}
}
