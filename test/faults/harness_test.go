// Package faults is cohort's fault suite: the real binaries (with the mock
// plugins, for speed) under faults injected from outside (SIGKILL and
// SIGSTOP of a worker, of the coordinator, of `cohort run`; crashes during
// checkpoint writes; losing ranks below min_ranks). Each case checks what
// an operator would: the exit status and summary, that every epoch counts
// the whole data set and the mock trainer's ledger shows every sample
// trained, that no process of the test's binaries outlives it, that no
// arena is left in /dev/shm, and that a run with a checkpoint resumes.
// docs/reliability.md lists each fault with its test.
package faults

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"

	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/testutil/arenacheck"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugintest"
)

func TestMain(m *testing.M) {
	code := arenacheck.Run(m)
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// build is this test binary's one build of cohort, with the mock plugins
// in plugins/ beside it. Every process the suite starts runs a binary from
// build.dir, which is how the orphan check recognises them.
var build struct {
	once sync.Once
	dir  string
	err  error
}

func cohortBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the cohort binary")
	}
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "cohort-faults-")
		if build.err != nil {
			return
		}
		for _, args := range [][]string{
			{"build", "-o", filepath.Join(build.dir, "cohort"), "github.com/cohortdl/cohort/cmd/cohort"},
			{"build", "-o", filepath.Join(build.dir, "plugins") + "/", plugintest.TrainerPackage, plugintest.AveragerPackage},
		} {
			if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
				build.err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return filepath.Join(build.dir, "cohort")
}

const secret = "fault-suite-secret-0123456789abcdef"

// proc is one cohort process the test started.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    bytes.Buffer // stdout and stderr
	lines  chan string  // stdout lines
	done   chan struct{}
	status syscall.WaitStatus
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, lines: make(chan string, 4096), done: make(chan struct{})}
	p.cmd = exec.Command(cohortBin(t), args...)
	p.cmd.Env = append(os.Environ(), "COHORT_SECRET="+secret, "COHORT_SECRET_FILE=")
	p.cmd.Stderr = writerFunc(func(b []byte) { p.mu.Lock(); p.out.Write(b); p.mu.Unlock() })
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		p.cmd.Wait()
		p.status = p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s (%s) output, tail:\n%s", name, strings.Join(args, " "), tail(p.output(), 4000))
		}
	})
	return p
}

type writerFunc func([]byte)

func (w writerFunc) Write(b []byte) (int, error) { w(b); return len(b), nil }

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// waitLine waits for a stdout line holding substr and returns it.
func (p *proc) waitLine(substr string, timeout time.Duration) string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, substr) {
				return l
			}
		case <-p.done:
			p.t.Fatalf("%s exited (%v) before printing %q", p.name, p.status, substr)
		case <-deadline:
			p.t.Fatalf("%s printed no %q within %v", p.name, substr, timeout)
		}
	}
}

// waitOutput waits for substr in the process's output (stdout and
// stderr) after its first from bytes.
func (p *proc) waitOutput(substr string, from int, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !p.printed(substr, from) {
		select {
		case <-p.done:
			p.t.Fatalf("%s exited (%v) before printing %q", p.name, p.status, substr)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s printed no %q within %v", p.name, substr, timeout)
		}
	}
}

// printed reports whether substr is in the output after its first from
// bytes, reading the buffer in place (the run's debug log grows fast).
func (p *proc) printed(substr string, from int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.out.Bytes()[from:], []byte(substr))
}

// exit waits for the process and returns its exit code (-1 when a signal
// ended it).
func (p *proc) exit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.status.ExitStatus()
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v", p.name, timeout)
		return 0
	}
}

// run is one case's run: its directory, config and ledger.
type run struct {
	t                 *testing.T
	dir, out, cfg     string
	ledger            string
	samples, epochs   int
	ranks             int
	trainer, averager map[string]any
}

// newRun writes a config for the mock plugins: the run and coordinator
// blocks as given (ranks, epochs and out come from r), the trainer's
// samples and ledger set here.
func newRun(t *testing.T, ranks, epochs, samples int, coordinatorBlock, workerBlock string, trainer, averager map[string]any) *run {
	t.Helper()
	dir := t.TempDir()
	r := &run{t: t, dir: dir, out: filepath.Join(dir, "run"), cfg: filepath.Join(dir, "cohort.hcl"),
		ledger: filepath.Join(dir, "ledger"), samples: samples, epochs: epochs, ranks: ranks,
		trainer: map[string]any{"samples": samples, "batch_size": 16}, averager: averager}
	r.trainer["ledger"] = r.ledger
	for k, v := range trainer {
		r.trainer[k] = v
	}
	src := fmt.Sprintf("run {\n  ranks = %d\n  epochs = %d\n  seed = 7\n}\ncoordinator {\n%s\n}\nworker {\n%s\n}\ntrainer \"mock\" {\n%s}\naverager \"mock\" {\n%s}\n",
		ranks, epochs, coordinatorBlock, workerBlock, hclBody(r.trainer), hclBody(averager))
	if err := os.WriteFile(r.cfg, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

func hclBody(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		v, _ := json.Marshal(m[k])
		fmt.Fprintf(&b, "  %s = %s\n", k, v)
	}
	return b.String()
}

// launch starts `cohort run` on r (with -v, so the coordinator's Info
// lines reach stderr), continuing its last checkpoint when resume is set.
func (r *run) launch(resume bool) *proc {
	args := []string{"run", "-v", "--config", r.cfg, "--out", r.out}
	if resume {
		args = append(args, "--resume", r.out)
	} else {
		args = append(args, "--force")
	}
	return start(r.t, "cohort run", args...)
}

func (r *run) summary() *record.Summary {
	r.t.Helper()
	s, err := record.ReadSummary(filepath.Join(r.out, record.SummaryFile))
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// checkCompleted: the run completed every epoch, each epoch's figures
// count the whole data set, and the ledger shows every sample of every
// epoch trained (by some rank; a sample trained again after a crash is
// allowed, one never trained is not).
func (r *run) checkCompleted() *record.Summary {
	r.t.Helper()
	sum := r.summary()
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != r.epochs {
		r.t.Fatalf("summary: status %s, %d epochs, want completed with %d", sum.Status, len(sum.Epochs), r.epochs)
	}
	for _, e := range sum.Epochs {
		if e.Samples != uint64(r.samples) {
			r.t.Errorf("epoch %d counts %d samples, want %d", e.Epoch, e.Samples, r.samples)
		}
		var shares uint64
		for _, rk := range e.Ranks {
			shares += rk.Samples
		}
		if shares != e.Samples {
			r.t.Errorf("epoch %d: the ranks' shares sum to %d, the epoch counts %d", e.Epoch, shares, e.Samples)
		}
	}
	led := readLedger(r.t, r.ledger)
	for e := range r.epochs {
		if n := len(led[uint64(e)]); n != r.samples {
			r.t.Errorf("epoch %d: the ledger shows %d distinct samples trained, want %d", e, n, r.samples)
		}
	}
	return sum
}

// readLedger parses the mock trainer's ledger ("rank epoch sample" lines):
// per epoch, per sample, the ranks that trained it.
func readLedger(t *testing.T, path string) map[uint64]map[uint64][]uint32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]map[uint64][]uint32{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r uint32
		var e, i uint64
		if _, err := fmt.Sscan(line, &r, &e, &i); err != nil {
			// A process killed mid-write leaves a torn last line.
			continue
		}
		if out[e] == nil {
			out[e] = map[uint64][]uint32{}
		}
		out[e][i] = append(out[e][i], r)
	}
	return out
}

// ours lists the live processes running a binary of this test's build
// (cohort, its workers, their plugins), by pid.
func ours() map[int]string {
	found := map[int]string{}
	if build.dir == "" {
		return found
	}
	for _, p := range proctab.List() {
		// A zombie has exited; its parent has yet to reap it.
		if !p.Zombie() && len(p.Args) > 0 && strings.HasPrefix(p.Args[0], build.dir+"/") {
			found[p.PID] = strings.Join(p.Args, " ")
		}
	}
	return found
}

// checkNothingLeft waits up to timeout for every process of the build to
// end and every arena of the run to go, then fails the test for what is
// left.
func checkNothingLeft(t *testing.T, runID string, timeout time.Duration) {
	t.Helper()
	arenas := func() []string {
		if runID == "" {
			return nil
		}
		m, _ := filepath.Glob(filepath.Join(arena.DefaultDir, "cohort-"+runID+"-*"))
		return m
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && (len(ours()) > 0 || len(arenas()) > 0) {
		time.Sleep(50 * time.Millisecond)
	}
	for pid, cmd := range ours() {
		t.Errorf("orphan process %d: %s", pid, cmd)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if a := arenas(); len(a) > 0 {
		t.Errorf("arenas left in %s: %q", arena.DefaultDir, a)
	}
}

// runID reads the run id from `cohort run`'s "run <id>: ..." line.
func runID(t *testing.T, p *proc) string {
	t.Helper()
	line := p.waitLine(" ranks, ", 30*time.Second)
	var id string
	if _, err := fmt.Sscanf(line, "run %s", &id); err != nil {
		t.Fatalf("no run id in %q: %v", line, err)
	}
	return strings.TrimSuffix(id, ":")
}

// workers returns the pids of `cohort worker` children of parent, by rank.
func workers(t *testing.T, parent int) map[int]int {
	t.Helper()
	out := map[int]int{}
	for pid, cmd := range ours() {
		stat, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(parent) {
			continue
		}
		args := strings.Fields(cmd)
		if i := slices.Index(args, "--rank"); i > 0 && slices.Contains(args, "worker") && i+1 < len(args) {
			r, _ := strconv.Atoi(args[i+1])
			out[r] = pid
		}
	}
	return out
}

func sscanf(s, format string, a ...any) (int, error) { return fmt.Sscanf(s, format, a...) }

// arenasOf lists the arenas in /dev/shm whose owner is gone: what a
// killed process left and nobody swept.
func arenasOf(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir(arena.DefaultDir)
	var out []string
	for _, e := range ents {
		if _, ok := arena.Owner(e.Name(), worker.ArenaPrefix); ok && arena.OwnerGone(e.Name(), worker.ArenaPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}
