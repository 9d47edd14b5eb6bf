package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// pluginBuilds are the built-in plugins built into the test cohort's
// plugins directory, each once per test binary.
var pluginBuilds sync.Map // name -> *pluginBuild

type pluginBuild struct {
	once sync.Once
	err  error
}

// buildPlugin builds plugins/NAME as cohort-NAME beside the test cohort's
// mock plugins (averaging-cpu for the reduce server's channel,
// averaging-nccl for its refusal on a host without NCCL).
func buildPlugin(t *testing.T, name string) {
	t.Helper()
	bin := cohortBinary(t)
	v, _ := pluginBuilds.LoadOrStore(name, &pluginBuild{})
	b := v.(*pluginBuild)
	b.once.Do(func() {
		out, err := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(bin), "plugins", "cohort-"+name),
			"github.com/cohortdl/cohort/plugins/"+name).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("build %s: %w\n%s", name, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
}

// tlsInit runs `cohort tls init` into dir/tls.
func tlsInit(t *testing.T, dir string, args ...string) {
	t.Helper()
	out, err := exec.Command(cohortBinary(t), append([]string{"tls", "init", "--out", filepath.Join(dir, "tls")}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("cohort tls init: %v\n%s", err, out)
	}
}

// `cohort run` with both sides' tls blocks: the control channel and the
// reduce server's run over mutual TLS with the files `cohort tls init`
// wrote, found beside the config; a worker holding another CA's files is
// refused, and both the coordinator and the worker say why.
func TestRunWithTLS(t *testing.T) {
	buildPlugin(t, "averaging-cpu")
	dir, foreign := t.TempDir(), t.TempDir()
	tlsInit(t, dir, "--hosts", "head,node", "--localhost")
	tlsInit(t, foreign, "--hosts", "node", "--localhost")
	for _, name := range []string{"ca.pem", "head.pem", "head-key.pem", "node.pem", "node-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, "tls", name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, "-key.pem") && st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", name, st.Mode().Perm())
		}
	}
	// config writes a config beside dir's tls/, whose worker block names
	// the files of workerHost in workerDir.
	config := func(name, workerDir, workerHost string) string {
		path := filepath.Join(dir, name)
		src := fmt.Sprintf(`coordinator {
  sync_every        = 4
  formation_timeout = "20s"
  tls {
    ca   = "tls/ca.pem"
    cert = "tls/head.pem"
    key  = "tls/head-key.pem"
  }
}
worker {
  connect_timeout = "5s"
  tls {
    ca   = %q
    cert = %q
    key  = %q
  }
}
trainer "mock" {
  samples    = 256
  batch_size = 16
}
averager "cpu" {}
`, filepath.Join(workerDir, "ca.pem"), filepath.Join(workerDir, workerHost+".pem"), filepath.Join(workerDir, workerHost+"-key.pem"))
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}

	t.Run("completes", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "run")
		p := startCohort(t, "run", "-v", "--config", config("cohort.hcl", filepath.Join(dir, "tls"), "node"), "--ranks", "2", "--epochs", "1", "--out", out)
		if code := p.wait(120 * time.Second); code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
		sum := readSummary(t, out)
		if sum.Status != record.StatusCompleted || sum.Averaging.Backend != "cpu" || sum.Averaging.Rounds == 0 {
			t.Fatalf("summary: status %s, averaging %+v", sum.Status, sum.Averaging)
		}
		if log := p.stderrText(); !strings.Contains(log, "tls=true") {
			t.Errorf("the coordinator's log does not say it runs TLS:\n%s", tail(log, 3000))
		}
	})

	t.Run("another CA is refused", func(t *testing.T) {
		p := startCohort(t, "run", "--config", config("foreign.hcl", filepath.Join(foreign, "tls"), "node"), "--ranks", "1", "--epochs", "1",
			"--out", filepath.Join(t.TempDir(), "run"))
		if code := p.wait(60 * time.Second); code != exitFailed {
			t.Fatalf("exit %d, want %d", code, exitFailed)
		}
		log := p.stderrText()
		for _, want := range []string{
			"refused a rank connection", "remote=127.0.0.1:", "the rank refused this side's TLS certificate", // the coordinator
			"the coordinator's TLS certificate did not verify", // the worker
		} {
			if !strings.Contains(log, want) {
				t.Errorf("stderr does not say %q:\n%s", want, tail(log, 3000))
			}
		}
	})

	t.Run("one side only is refused", func(t *testing.T) {
		path := filepath.Join(dir, "one-sided.hcl")
		src := "coordinator {\n  tls {\n    ca = \"tls/ca.pem\"\n    cert = \"tls/head.pem\"\n    key = \"tls/head-key.pem\"\n  }\n}\n"
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startCohort(t, "run", "--config", path, "--trainer", "mock", "--averaging", "mock", "--out", filepath.Join(t.TempDir(), "run"))
		if code := p.wait(30 * time.Second); code != exitUsage || !strings.Contains(p.stderrText(), "go together") {
			t.Errorf("exit %d, want %d saying the tls blocks go together:\n%s", code, exitUsage, p.stderrText())
		}
	})
}
