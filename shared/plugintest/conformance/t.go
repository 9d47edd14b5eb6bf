package conformance

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/shared/plugin"
)

// T is what the suite needs of a test: *testing.T's methods, with Run
// taking a T so the suite can also run under a recorder (to prove that a
// broken implementation fails it). Testing adapts a *testing.T.
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	// Fatalf records a failure and ends the calling goroutine, as
	// testing.T.Fatalf does.
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
	// Run runs f as the subtest name and reports whether it passed.
	Run(name string, f func(T)) bool
}

// Testing adapts t to T.
func Testing(t *testing.T) T { return stdT{t} }

type stdT struct{ *testing.T }

func (s stdT) Run(name string, f func(T)) bool {
	return s.T.Run(name, func(t *testing.T) { f(stdT{t}) })
}

// AveragerFactory makes a fresh, unconfigured averager for one rank. What
// it starts it ends at t's cleanup; an error fails the check that asked.
type AveragerFactory func(t T) (plugin.Averager, error)

// TrainerFactory makes a fresh, unconfigured trainer, as AveragerFactory.
type TrainerFactory func(t T) (plugin.Trainer, error)

// AveragerBinary runs the suite out of process: every averager is the
// plugin binary path, started under go-plugin as a rank's core starts it,
// with env ("KEY=value") added to the test's environment. The process is
// killed at the cleanup of the test that started it.
func AveragerBinary(path string, env ...string) AveragerFactory {
	return func(t T) (plugin.Averager, error) {
		return plugin.DispenseAverager(startClient(t, path, env))
	}
}

// TrainerBinary is AveragerBinary for a trainer plugin.
func TrainerBinary(path string, env ...string) TrainerFactory {
	return func(t T) (plugin.Trainer, error) {
		return plugin.DispenseTrainer(startClient(t, path, env))
	}
}

func startClient(t T, path string, env []string) *goplugin.Client {
	cmd := exec.Command(path)
	cmd.Env = os.Environ()
	// A race-built plugin sleeps a second at exit unless told not to, and
	// every Kill would wait for it; other builds ignore the setting.
	if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
		cmd.Env = append(cmd.Env, strings.TrimSpace("GORACE="+g+" atexit_sleep_ms=0"))
	}
	cmd.Env = append(cmd.Env, env...)
	cfg := plugin.ClientConfig(plugin.ClientOptions{Cmd: cmd, Logger: testLogger(t), StartTimeout: 30 * time.Second})
	// go-plugin appends the host's environment after cmd.Env, and the last
	// value of a key wins: cmd.Env already holds it.
	cfg.SkipHostEnv = true
	c := goplugin.NewClient(cfg)
	t.Cleanup(func() { plugin.Kill(c) })
	return c
}

// testLogger logs warnings and worse into t until t's cleanup, so lines a
// plugin's log stream delivers late never reach a finished test.
func testLogger(t T) hclog.Logger {
	w := &logWriter{t: t}
	// Registered before the client's Kill, so it runs after it.
	t.Cleanup(w.stop)
	return hclog.New(&hclog.LoggerOptions{Name: "conformance", Level: hclog.Warn, Output: w, Mutex: &w.mu})
}

type logWriter struct {
	mu   sync.Mutex // held by hclog around Write
	t    T
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	if !w.done {
		w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	}
	return len(p), nil
}

func (w *logWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}
