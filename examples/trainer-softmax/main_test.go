package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cohortdl/cohort/shared/plugintest/conformance"

	"example.com/cohort-trainer-softmax/softmax"
)

// The built binary passes the same suite as a go-plugin subprocess, as a
// worker runs it.
func TestConformanceAsPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin binary")
	}
	bin := filepath.Join(t.TempDir(), "cohort-trainer-softmax")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the plugin: %v\n%s", err, out)
	}
	conformance.RunTrainer(t, conformance.TrainerBinary(bin), conformance.TrainerSettings([]byte(softmax.SmallSettings)))
}
