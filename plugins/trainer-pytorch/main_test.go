package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// buildPlugin builds the launcher, as make build does.
func buildPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cohort-trainer-pytorch")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the plugin: %v\n%s", err, out)
	}
	return bin
}

func settings(t *testing.T, kv map[string]any) []byte {
	t.Helper()
	raw, err := json.Marshal(kv)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The Python trainer, started as a worker starts it (a go-plugin
// subprocess over mutual TLS), keeps every promise of the contract.
func TestConformanceAsPlugin(t *testing.T) {
	file, err := filepath.Abs("testdata/small.py")
	if err != nil {
		t.Fatal(err)
	}
	conformance.RunTrainer(t, conformance.TrainerBinary(buildPlugin(t)),
		conformance.TrainerSettings(settings(t, map[string]any{"file": file})),
		conformance.BadTrainerSettings(
			settings(t, map[string]any{}),
			settings(t, map[string]any{"file": filepath.Join(t.TempDir(), "absent.py")}),
			settings(t, map[string]any{"file": file, "batch_size": -1}),
		))
}
