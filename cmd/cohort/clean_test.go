package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// alarm is a log line at WARN or ERROR, as hclog writes it.
var alarm = regexp.MustCompile(`\[(ERROR|WARN)\]`)

// A clean run raises no alarm: its console (stdout and stderr) and every
// log in OUT/logs hold no [ERROR] or [WARN] line, the averaging-cpu
// reduce server's goodbyes and the workers' teardown included; and every
// file it writes has one mode, an os.Create'd file's.
func TestCleanRunRaisesNoAlarm(t *testing.T) {
	buildPlugin(t, "averaging-cpu")
	t.Run("mock trainer", func(t *testing.T) {
		cfg := writeRunConfigAveraging(t, "coordinator {\n  sync_every = 4\n}", map[string]any{"samples": 1024, "batch_size": 16}, `averager "cpu" {}`)
		checkCleanRun(t, "--config", cfg, "--ranks", "4", "--epochs", "3")
	})
	// make run: the built-in configuration (libtorch's MLP on
	// Fashion-MNIST, 4 ranks, 3 epochs, averaging-cpu).
	t.Run("make run", func(t *testing.T) {
		buildLibtorch(t)
		out := checkCleanRun(t)
		if sum := readSummary(t, out); sum.Trainer != "libtorch" || sum.Averager != "cpu" || len(sum.Epochs) != 3 || sum.Epochs[2].Accuracy == nil {
			t.Errorf("the built-in configuration ran trainer %q, averager %q, %d epochs", sum.Trainer, sum.Averager, len(sum.Epochs))
		}
	})
}

// buildLibtorch builds the libtorch trainer and its shim (shim.mk) into
// the plugins directory beside the test's cohort binary, where the plugin
// looks for the shim first.
func buildLibtorch(t *testing.T) {
	t.Helper()
	buildPlugin(t, "trainer-libtorch")
	v, _ := pluginBuilds.LoadOrStore("libtorch shim", &pluginBuild{})
	b := v.(*pluginBuild)
	b.once.Do(func() {
		shim := filepath.Join(filepath.Dir(cohortBinary(t)), "plugins", "libcohort_torch_shim.so")
		out, err := exec.Command("make", "--no-print-directory", "-C", "../..", "-f", "plugins/trainer-libtorch/shim.mk", "SHIM_OUT="+shim, "shim").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("build the libtorch shim (make deps installs libtorch-dev): %w\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
}

// checkCleanRun runs `cohort run` with args, which must complete, checks
// its console, logs and files, and returns its out directory.
func checkCleanRun(t *testing.T, args ...string) string {
	out := filepath.Join(t.TempDir(), "run")
	p := startCohort(t, append([]string{"run", "--out", out}, args...)...)
	if code := p.wait(300 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	texts := map[string]string{"stdout": p.output(), "stderr": p.stderrText()}
	logs, _ := filepath.Glob(filepath.Join(out, LogsDir, "*.log"))
	if len(logs) != 5 {
		t.Fatalf("logs %v, want the coordinator's and 4 ranks'", logs)
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		texts[filepath.Base(l)] = string(b)
	}
	for name, text := range texts {
		for _, line := range strings.Split(text, "\n") {
			if alarm.MatchString(line) {
				t.Errorf("%s: %s", name, line)
			}
		}
	}

	probe := filepath.Join(t.TempDir(), "probe")
	f, err := os.Create(probe)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	st, _ := os.Stat(probe)
	want := st.Mode().Perm()
	n := 0
	filepath.WalkDir(out, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		if info, err := d.Info(); err == nil && info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v as every file of the run", path, info.Mode().Perm(), want)
		}
		return nil
	})
	if n < 10 {
		t.Errorf("%d files under %s: the run wrote less than expected", n, out)
	}
	return out
}
