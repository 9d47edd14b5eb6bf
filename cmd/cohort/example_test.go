package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// exampleDir is the averaging example: a Go module of its own, which
// requires the SDK module by version, as a vendor's does; go.work builds it
// against this checkout's SDK.
const exampleDir = "../../examples/averaging-trimmed-mean"

// exampleGo runs the go command in an example's module.
func exampleGo(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// The example, built as a vendor builds it, packaged and signed as a vendor
// ships it and installed as a site installs it (cohort plugins keygen,
// package, install: a plugin directory with a SHA256SUMS line and a lock
// file of accepted hashes, named by worker.plugin_dir and
// worker.plugin_lock, with a version constraint and its settings in the
// averager block), trains a cohort: its ranks meet through the relay, the
// run completes, and every rank's final checkpoint holds the same model.
// The mock trainer comes from the plugins directory beside the cohort
// binary, searched after plugin_dir.
func TestVendorExampleRuns(t *testing.T) {
	cohort := cohortBinary(t) // skips under -short; builds the mock trainer too
	build := t.TempDir()
	bin := filepath.Join(build, "cohort-averaging-trimmedmean")
	start := time.Now()
	exampleGo(t, exampleDir, "build", "-o", bin, ".")
	t.Logf("built the example in %v", time.Since(start).Round(time.Millisecond))

	dir, lock := t.TempDir(), filepath.Join(t.TempDir(), "cohort.lock.json")
	key := filepath.Join(build, "vendor")
	pkg := filepath.Join(build, "trimmedmean-0.1.0.tar.gz")
	for _, args := range [][]string{
		{"plugins", "keygen", "-o", key},
		{"plugins", "package", "--name", "trimmedmean", "--kind", "averager", "--version", "0.1.0", "--key", key + ".key",
			"--bin", runtime.GOOS + "/" + runtime.GOARCH + "=" + bin, "-o", pkg},
		{"plugins", "install", pkg, "--trust", key + ".pub", "--dir", dir, "--lock", lock},
	} {
		if out, err := exec.Command(cohort, args...).CombinedOutput(); err != nil {
			t.Fatalf("cohort %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS")); err != nil || !strings.Contains(string(sums), "  cohort-averaging-trimmedmean") {
		t.Fatalf("install left no SHA256SUMS line for the plugin: %q, %v", sums, err)
	}

	const ranks, epochs = 3, 2
	trainer := map[string]any{"samples": 768, "batch_size": 16}
	cfg := filepath.Join(t.TempDir(), "cohort.hcl")
	src := `coordinator {
  sync_every       = 4
  checkpoint_every = 2   # the final checkpoint holds every rank's model
}
worker {
  plugin_dir  = "` + dir + `"
  plugin_lock = "` + lock + `"
}
trainer "mock" {
  samples    = 768
  batch_size = 16
}
averager "trimmedmean" {
  version = ">= 0.1, < 1"
  trim    = 1
}
`
	if err := os.WriteFile(cfg, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "run")
	start = time.Now()
	p := startCohort(t, "run", "--config", cfg, "--trainer", "mock", "--averaging", "trimmedmean",
		"--ranks", strconv.Itoa(ranks), "--epochs", strconv.Itoa(epochs), "--out", out)
	if code := p.wait(120 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	t.Logf("%d ranks × %d epochs in %v", ranks, epochs, time.Since(start).Round(time.Millisecond))
	s := readSummary(t, out)
	if s.Status != record.StatusCompleted || len(s.Epochs) != epochs || len(s.Ranks) != ranks {
		t.Fatalf("summary: status %s, %d epochs, %d ranks", s.Status, len(s.Epochs), len(s.Ranks))
	}
	if s.Averaging.Backend != "trimmedmean" || s.Averaging.Rounds == 0 {
		t.Errorf("averaging %+v, want rounds of backend trimmedmean", s.Averaging)
	}
	for _, e := range s.Epochs {
		if e.Rounds == 0 {
			t.Errorf("epoch %+v ran no averaging rounds", e)
		}
	}
	checkOneModel(t, s, ranks, trainer)
}
