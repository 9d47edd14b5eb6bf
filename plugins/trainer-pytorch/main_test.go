package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// built is the test binary's one build of the launcher.
var built struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildPlugin builds the launcher, as make build does, once.
func buildPlugin(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "trainer-pytorch-test-"); built.err != nil {
			return
		}
		bin := filepath.Join(built.dir, "cohort-trainer-pytorch")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("build the plugin: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, "cohort-trainer-pytorch")
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
