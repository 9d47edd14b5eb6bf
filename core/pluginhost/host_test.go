package pluginhost_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
	"github.com/hashicorp/go-hclog"
)

func TestMain(m *testing.M) {
	code := m.Run()
	plugintest.RemoveBuilds()
	os.Exit(code)
}

// allStopped reports whether every thread of pid is stopped by a signal.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(filepath.Join("/proc", itoa(pid), "task"))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "task", task.Name(), "stat"))
		if err != nil {
			return false
		}
		// The state follows the command name's closing parenthesis.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	// A zombie still answers kill(0); it has exited all the same.
	b, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "stat"))
	if err != nil {
		return false
	}
	for i := 0; i < len(b); i++ {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] != 'Z'
		}
	}
	return true
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// The host launches both mock plugins by name from a plugin directory,
// talks to them, and stops them: Shutdown RPC first, then the process is
// gone; StopAll afterwards has nothing left to do.
func TestStartTalkStop(t *testing.T) {
	trainerBin, averagerBin := plugintest.BuildPlugins(t)
	dir := t.TempDir()
	for _, bin := range []string{trainerBin, averagerBin} {
		if err := os.Symlink(bin, filepath.Join(dir, filepath.Base(bin))); err != nil {
			t.Fatal(err)
		}
	}
	h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Env: []string{"GORACE=atexit_sleep_ms=0"}})
	ctx := context.Background()

	tr, tp, err := h.StartTrainer(ctx, plugintest.TrainerName)
	if err != nil {
		t.Fatal(err)
	}
	av, ap, err := h.StartAverager(ctx, plugintest.AveragerName)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := tr.Describe(ctx); err != nil || d.Name == "" {
		t.Fatalf("trainer Describe = %+v, %v", d, err)
	}
	if d, err := av.Describe(ctx); err != nil || d.Name == "" {
		t.Fatalf("averager Describe = %+v, %v", d, err)
	}
	tpid, apid := tp.Pid(), ap.Pid()
	if !alive(tpid) || !alive(apid) {
		t.Fatalf("plugin pids %d %d not running", tpid, apid)
	}

	if err := h.Stop(ctx, tp); err != nil {
		t.Fatalf("Stop trainer: %v", err)
	}
	if alive(tpid) {
		t.Fatalf("trainer %d still running after Stop", tpid)
	}
	if err := h.StopAll(ctx); err != nil {
		t.Fatalf("StopAll: %v", err)
	}
	if alive(apid) {
		t.Fatalf("averager %d still running after StopAll", apid)
	}
	if err := h.Stop(ctx, tp); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// A plugin that does not answer Shutdown within the grace period is killed.
func TestStopKillsAfterGrace(t *testing.T) {
	trainerBin, _ := plugintest.BuildPlugins(t)
	dir := t.TempDir()
	os.Symlink(trainerBin, filepath.Join(dir, filepath.Base(trainerBin)))
	h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, Grace: 300 * time.Millisecond, Env: []string{"GORACE=atexit_sleep_ms=0"}})
	ctx := context.Background()
	_, p, err := h.StartTrainer(ctx, plugintest.TrainerName)
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Pid()
	// Freeze it: the Shutdown RPC cannot be answered once every thread has
	// stopped (SIGSTOP reaches the threads on other CPUs a moment later).
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !allStopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the plugin's threads did not all stop")
		}
	}
	start := time.Now()
	err = h.Stop(ctx, p)
	if err == nil {
		t.Fatal("Stop of a frozen plugin reported a clean shutdown")
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("Stop took %v", time.Since(start))
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("frozen plugin %d survived Stop", pid)
	}
}

// A plugin killed under the host leaves its unix socket, which it would
// have removed on its way out; Stop removes it, for a plugin replaced
// after a crash and for one found dead at teardown alike.
func TestStopRemovesAKilledPluginsSocket(t *testing.T) {
	trainerBin, averagerBin := plugintest.BuildPlugins(t)
	dir := t.TempDir()
	for _, bin := range []string{trainerBin, averagerBin} {
		if err := os.Symlink(bin, filepath.Join(dir, filepath.Base(bin))); err != nil {
			t.Fatal(err)
		}
	}
	tmp := t.TempDir()
	h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Env: []string{"GORACE=atexit_sleep_ms=0", "TMPDIR=" + tmp}})
	ctx := context.Background()
	_, tp, err := h.StartTrainer(ctx, plugintest.TrainerName)
	if err != nil {
		t.Fatal(err)
	}
	_, ap, err := h.StartAverager(ctx, plugintest.AveragerName)
	if err != nil {
		t.Fatal(err)
	}
	sockets := func() []string {
		m, _ := filepath.Glob(filepath.Join(tmp, "*"))
		return m
	}
	if n := len(sockets()); n != 2 {
		t.Fatalf("%d files in the plugins' TMPDIR, want their 2 sockets: %q", n, sockets())
	}
	for _, p := range []*pluginhost.Process{tp, ap} {
		pid := p.Pid()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); alive(pid); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("plugin %d outlived SIGKILL", pid)
			}
		}
	}
	h.Stop(ctx, tp) // replaced after a crash
	if n := len(sockets()); n != 1 {
		t.Fatalf("after the killed trainer's Stop: %q, want only the averager's socket", sockets())
	}
	h.StopAll(ctx) // found dead at teardown
	if left := sockets(); len(left) > 0 {
		t.Fatalf("left after StopAll: %q", left)
	}
}

// A plugin logs at the host logger's level unless the environment names
// one: its debug line at start ("serving") reaches a debug host's log and
// not an info host's, nor a debug host's whose environment says info.
func TestPluginLogsAtTheHostsLevel(t *testing.T) {
	trainerBin, _ := plugintest.BuildPlugins(t)
	dir := t.TempDir()
	if err := os.Symlink(trainerBin, filepath.Join(dir, filepath.Base(trainerBin))); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		level hclog.Level
		env   string // COHORT_LOG_LEVEL, "" unset
		want  bool
	}{
		{"debug host", hclog.Debug, "", true},
		{"info host", hclog.Info, "", false},
		{"environment wins", hclog.Debug, "info", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(plugin.LogLevelEnv, c.env) // restored after the case
			if c.env == "" {
				os.Unsetenv(plugin.LogLevelEnv)
			}
			var log plugintest.LogBuffer
			h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Env: []string{"GORACE=atexit_sleep_ms=0"},
				Logger: hclog.New(&hclog.LoggerOptions{Level: c.level, Output: &log})})
			ctx := context.Background()
			_, p, err := h.StartTrainer(ctx, plugintest.TrainerName)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Stop(ctx, p); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(log.String(), "serving"); got != c.want {
				t.Fatalf("the plugin's debug line in the host's log: %v, want %v:\n%s", got, c.want, log.String())
			}
		})
	}
}
