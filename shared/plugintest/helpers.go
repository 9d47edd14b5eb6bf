package plugintest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/shared/plugin"
)

// The mock plugins' main packages and the binaries BuildPlugins makes.
const (
	TrainerPackage  = "github.com/cohortdl/cohort/cmd/cohort-trainer-mock"
	AveragerPackage = "github.com/cohortdl/cohort/cmd/cohort-averaging-mock"
	TrainerBinary   = "cohort-trainer-mock"
	AveragerBinary  = "cohort-averaging-mock"
)

// builds is the one build of the mock plugins per test binary.
var builds struct {
	once sync.Once
	dir  string
	err  error
}

// BuildPlugins builds the mock trainer and averager binaries, once per test
// binary (with -race when the tests run with it), and returns their paths.
// They live in a temporary directory that RemoveBuilds deletes; a TestMain
// should call it after m.Run. A build failure fails t. The binaries are
// cohort's commands (TrainerPackage, AveragerPackage), so the go command
// must resolve cohort's module: in a cohort checkout, or in a module that
// requires it.
func BuildPlugins(t testing.TB) (trainerBin, averagerBin string) {
	t.Helper()
	builds.once.Do(func() {
		start := time.Now()
		builds.dir, builds.err = buildPlugins()
		if builds.err == nil {
			t.Logf("built the mock plugins in %v", time.Since(start).Round(time.Millisecond))
		}
	})
	if builds.err != nil {
		t.Fatalf("build the mock plugins: %v", builds.err)
	}
	return filepath.Join(builds.dir, TrainerBinary), filepath.Join(builds.dir, AveragerBinary)
}

func buildPlugins() (string, error) {
	dir, err := os.MkdirTemp("", "cohort-plugintest-")
	if err != nil {
		return "", err
	}
	args := []string{"build", "-buildvcs=false", "-o", dir + string(filepath.Separator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, TrainerPackage, AveragerPackage)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("%v: %w\n%s", cmd.Args, err, out.Bytes())
	}
	return dir, nil
}

// RemoveBuilds deletes what BuildPlugins built, if anything.
func RemoveBuilds() {
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
}

// StartTrainer launches the trainer plugin bin under go-plugin, with env
// ("KEY=value") added to the test's environment, and returns the dispensed
// Trainer and the client. The client is killed at t's cleanup.
func StartTrainer(t testing.TB, bin string, env ...string) (plugin.Trainer, *goplugin.Client) {
	t.Helper()
	c := StartClient(t, bin, nil, env...)
	tr, err := plugin.DispenseTrainer(c)
	if err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	return tr, c
}

// StartAverager is StartTrainer for an averager plugin.
func StartAverager(t testing.TB, bin string, env ...string) (plugin.Averager, *goplugin.Client) {
	t.Helper()
	c := StartClient(t, bin, nil, env...)
	a, err := plugin.DispenseAverager(c)
	if err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	return a, c
}

// StartClient makes the go-plugin client of bin, not yet started, with
// plugin.ClientConfig. Its log goes to logger, or to t's log at info level
// when logger is nil. env is added to the test's environment (and wins over
// it). The client is killed at t's cleanup.
func StartClient(t testing.TB, bin string, logger hclog.Logger, env ...string) *goplugin.Client {
	t.Helper()
	if logger == nil {
		logger = NewTestLogger(t, hclog.Info)
	}
	cmd := exec.Command(bin)
	cmd.Env = os.Environ()
	if raceEnabled {
		// A race-built process sleeps a second at exit unless told not to;
		// every Kill would wait for it.
		if g := os.Getenv("GORACE"); !strings.Contains(g, "atexit_sleep_ms") {
			cmd.Env = append(cmd.Env, strings.TrimSpace("GORACE="+g+" atexit_sleep_ms=0"))
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cfg := plugin.ClientConfig(plugin.ClientOptions{Cmd: cmd, Logger: logger, StartTimeout: 30 * time.Second})
	// go-plugin appends the host's environment after cmd.Env, and the last
	// value of a key wins: cmd.Env already holds it.
	cfg.SkipHostEnv = true
	c := goplugin.NewClient(cfg)
	t.Cleanup(func() { plugin.Kill(c) })
	return c
}

// NewTestLogger is an hclog logger into t's log that goes quiet when t ends,
// so lines a plugin's log stream delivers late never reach a finished test.
func NewTestLogger(t testing.TB, level hclog.Level) hclog.Logger {
	w := &testWriter{t: t}
	// Registered before the caller's cleanups, so it runs after them
	// (after the client's Kill).
	t.Cleanup(w.stop)
	return hclog.New(&hclog.LoggerOptions{Name: "host", Level: level, Output: w, Mutex: &w.mu})
}

// testWriter writes lines into t.Log until stopped.
type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

// Write is called with mu held (hclog's Mutex).
func (w *testWriter) Write(p []byte) (int, error) {
	if !w.done {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

func (w *testWriter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}
