package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// The built binary passes the same suite as a go-plugin subprocess, as a
// worker runs it.
func TestConformanceAsPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin binary")
	}
	bin := filepath.Join(t.TempDir(), "cohort-averaging-trimmedmean")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the plugin: %v\n%s", err, out)
	}
	conformance.RunAverager(t, conformance.AveragerBinary(bin), conformance.NotWeightedMean())
}
