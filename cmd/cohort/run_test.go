package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/testutil/arenacheck"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// String returns what was written, when the sink is a buffer.
func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.w.(fmt.Stringer); ok {
		return s.String()
	}
	return ""
}

func TestMain(m *testing.M) {
	code := arenacheck.Run(m)
	plugintest.RemoveBuilds()
	if cohortBuild.dir != "" {
		os.RemoveAll(cohortBuild.dir)
	}
	os.Exit(code)
}

// cohortBuild is the one build of the cohort binary, with the mock plugins
// and the median test averager (testdata/cohort-averaging-median) in
// plugins/ beside it (where a worker looks first), per test binary.
var cohortBuild struct {
	once sync.Once
	dir  string
	err  error
}

// cohortBinary builds cmd/cohort and the mock plugins once and returns the
// cohort binary's path.
func cohortBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the cohort binary")
	}
	cohortBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "cohort-run-test-")
		if err != nil {
			cohortBuild.err = err
			return
		}
		cohortBuild.dir = dir
		for _, b := range [][]string{
			{"build", "-o", filepath.Join(dir, "cohort"), "github.com/cohortdl/cohort/cmd/cohort"},
			{"build", "-o", filepath.Join(dir, "plugins") + string(filepath.Separator), plugintest.TrainerPackage, plugintest.AveragerPackage,
				"github.com/cohortdl/cohort/cmd/cohort/testdata/cohort-averaging-median"},
		} {
			out, err := exec.Command("go", b...).CombinedOutput()
			if err != nil {
				cohortBuild.err = fmt.Errorf("go %s: %w\n%s", strings.Join(b, " "), err, out)
				return
			}
		}
	})
	if cohortBuild.err != nil {
		t.Fatal(cohortBuild.err)
	}
	return filepath.Join(cohortBuild.dir, "cohort")
}

// proc is a running `cohort run`: its stdout lines arrive on lines, its
// stderr is kept for the failure message.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string
	stdout []string
	stderr *lockedWriter
	mu     sync.Mutex
	done   chan struct{}
	code   int
}

func startCohort(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, lines: make(chan string, 1024), done: make(chan struct{})}
	p.cmd = exec.Command(cohortBinary(t), args...)
	p.cmd.Dir = t.TempDir()
	p.cmd.Env = append(os.Environ(), envSecret+"=", envSecretFile+"=")
	p.stderr = &lockedWriter{w: &bytes.Buffer{}}
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.stdout = append(p.stdout, sc.Text())
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("cohort %s\nstdout:\n%s\nstderr (tail):\n%s", strings.Join(args, " "), p.output(), tail(p.stderrText(), 6000))
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.stdout, "\n")
}

func (p *proc) stderrText() string { return p.stderr.String() }

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// waitLine waits for a stdout line starting with prefix.
func (p *proc) waitLine(prefix string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-p.done:
			p.t.Fatalf("cohort exited (%d) before printing %q", p.code, prefix)
		case <-deadline:
			p.t.Fatalf("no line %q within %v", prefix, timeout)
		}
	}
}

// wait returns the exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("cohort did not exit within %v", timeout)
		return -1
	}
}

// writeRunConfig writes a config for the mock plugins: trainer settings
// as given, the rest of the body as given.
func writeRunConfig(t *testing.T, body string, trainer map[string]any) string {
	t.Helper()
	return writeRunConfigAveraging(t, body, trainer, `averager "mock" {}`)
}

// writeRunConfigAveraging is writeRunConfig with averager as the averager
// block.
func writeRunConfigAveraging(t *testing.T, body string, trainer map[string]any, averager string) string {
	t.Helper()
	settings := []string{}
	keys := make([]string, 0, len(trainer))
	for k := range trainer {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v, _ := json.Marshal(trainer[k])
		settings = append(settings, fmt.Sprintf("  %s = %s", k, v))
	}
	src := fmt.Sprintf("%s\ntrainer \"mock\" {\n%s\n}\n%s\n", body, strings.Join(settings, "\n"), averager)
	path := filepath.Join(t.TempDir(), "cohort.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readSummary(t *testing.T, out string) *record.Summary {
	t.Helper()
	s, err := record.ReadSummary(filepath.Join(out, record.SummaryFile))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mockParams reads the mock model a rank saved into its checkpoint
// directory dir (the trainer's folder, dir/trainer), through the mock
// trainer's own LoadCheckpoint: weight and bias (parameters) and
// feature_mean (a buffer, also averaged), and its step count.
func mockParams(t *testing.T, dir string, settings map[string]any) (params []float32, steps uint64) {
	t.Helper()
	raw, _ := json.Marshal(settings)
	tr := plugintest.NewTrainer(nil)
	ctx := context.Background()
	if _, err := tr.Configure(ctx, plugin.TrainerConfig{Rank: 0, WorldSize: 1, Seed: 1, Settings: raw}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.LoadCheckpoint(ctx, filepath.Join(dir, "trainer"), plugin.LoadResume); err != nil {
		t.Fatal(err)
	}
	w, b, steps, _ := tr.Snapshot()
	return append(append(w, b...), tr.FeatureMean()...), steps
}

// A run completes, exit 0, with a complete summary and one model: the
// final checkpoint (checkpoint_every = epochs saves every rank's state
// after the last epoch's final round) holds the same parameters, bit for
// bit, on every rank. With the mock averager; and with an averager the core
// has never heard of (testdata/cohort-averaging-median: neither cpu nor
// mock, built from shared/ alone), whose ranks meet through the relay over
// the control protocol and nothing else.
func TestRunCompletes(t *testing.T) {
	cases := []struct {
		averager               string
		ranks, epochs, samples int
	}{
		{averager: "mock", ranks: 4, epochs: 3, samples: 1024},
		{averager: "median", ranks: 3, epochs: 2, samples: 768},
	}
	for _, tc := range cases {
		t.Run(tc.averager, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			trainer := map[string]any{"samples": tc.samples, "batch_size": 16}
			cfg := writeRunConfig(t, fmt.Sprintf(`coordinator {
  sync_every       = 4
  checkpoint_every = %d
}`, tc.epochs), trainer)
			start := time.Now()
			p := startCohort(t, "run", "--config", cfg, "--trainer", "mock", "--averaging", tc.averager,
				"--ranks", strconv.Itoa(tc.ranks), "--epochs", strconv.Itoa(tc.epochs), "--out", out)
			if code := p.wait(120 * time.Second); code != 0 {
				t.Fatalf("exit %d, want 0", code)
			}
			t.Logf("%d ranks × %d epochs in %v", tc.ranks, tc.epochs, time.Since(start).Round(time.Millisecond))
			sum := readSummary(t, out)
			if sum.Status != record.StatusCompleted || sum.WorldSize != tc.ranks || len(sum.Epochs) != tc.epochs || len(sum.Ranks) != tc.ranks {
				t.Fatalf("summary: status %s, world %d, %d epochs, %d ranks", sum.Status, sum.WorldSize, len(sum.Epochs), len(sum.Ranks))
			}
			for _, e := range sum.Epochs {
				if e.Samples != uint64(tc.samples) || e.Accuracy == nil || e.Loss <= 0 || e.Rounds == 0 {
					t.Errorf("epoch %+v", e)
				}
			}
			for _, r := range sum.Ranks {
				if r.State != record.RankExited {
					t.Errorf("rank %+v, want exited", r)
				}
			}
			if sum.Averaging.Backend != tc.averager || sum.Averaging.Rounds == 0 || len(sum.MembershipEvents) != 0 {
				t.Errorf("averaging %+v, events %+v", sum.Averaging, sum.MembershipEvents)
			}
			checkOneModel(t, sum, tc.ranks, trainer)
			if line := fmt.Sprintf("epoch %d/%d  loss", tc.epochs, tc.epochs); !strings.Contains(p.output(), line) {
				t.Errorf("no per-epoch progress line %q in the output", line)
			}
		})
	}
}

// checkOneModel: the run's final checkpoint holds, on every one of its
// ranks, the same trained parameters, bit for bit (ranks that did not meet
// would not).
func checkOneModel(t *testing.T, sum *record.Summary, ranks int, trainer map[string]any) {
	t.Helper()
	if sum.Checkpoint == "" {
		t.Fatal("no final checkpoint")
	}
	ref, steps := mockParams(t, filepath.Join(sum.Checkpoint, "rank-0"), trainer)
	for r := 1; r < ranks; r++ {
		if got, _ := mockParams(t, filepath.Join(sum.Checkpoint, "rank-"+strconv.Itoa(r)), trainer); !slices.Equal(got, ref) {
			t.Errorf("rank %d's final parameters differ from rank 0's", r)
		}
	}
	if steps == 0 || allZero(ref) {
		t.Errorf("the model did not train: %d steps", steps)
	}
}

func allZero(v []float32) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// workerPID finds the pid of `cohort worker --rank rank` started by the
// launcher parent.
func workerPID(t *testing.T, parent, rank int) int {
	t.Helper()
	for _, p := range proctab.List() {
		args := p.Args
		if i := slices.Index(args, "--rank"); p.PPID == parent && slices.Contains(args, "worker") && i >= 0 && i+1 < len(args) && args[i+1] == strconv.Itoa(rank) {
			return p.PID
		}
	}
	t.Fatalf("no worker of rank %d under pid %d", rank, parent)
	return 0
}

// readLedger parses the mock trainer's ledger: per epoch, per sample, the
// ranks that trained it.
func readLedger(t *testing.T, path string) map[uint64]map[uint64][]uint32 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[uint64]map[uint64][]uint32{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r uint32
		var e, i uint64
		if _, err := fmt.Sscan(sc.Text(), &r, &e, &i); err != nil {
			t.Fatalf("ledger line %q: %v", sc.Text(), err)
		}
		if out[e] == nil {
			out[e] = map[uint64][]uint32{}
		}
		out[e][i] = append(out[e][i], r)
	}
	return out
}

// The second must-show: a worker SIGKILLed mid-epoch. The run completes
// on three ranks, the summary names the death and its reason, and the
// ledger shows every sample of every epoch trained, the killed epoch's
// exactly once: by a survivor, or by the dead rank before its death was
// seen. (Between the mock's ledger write and its Batch report lies a
// window of microseconds; a kill landing there could show one batch twice,
// which the test allows and reports.)
func TestRunSurvivesKilledWorker(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "run")
	ledger := filepath.Join(dir, "ledger")
	const samples, batch = 2048, 16
	cfg := writeRunConfig(t, `coordinator {
  heartbeat_timeout = "2s"
  sync_every        = 4
}`, map[string]any{"samples": samples, "batch_size": batch, "sleep_per_batch": "10ms", "ledger": ledger})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "4", "--epochs", "2", "--out", out)
	p.waitLine("epoch 1/2", 60*time.Second)
	time.Sleep(100 * time.Millisecond)
	sum := killAndComplete(t, p, workerPID(t, p.cmd.Process.Pid, 2), out, 2)
	if len(sum.MembershipEvents) != 1 {
		t.Fatalf("membership events %+v, want the one death", sum.MembershipEvents)
	}
	ev := sum.MembershipEvents[0]
	if ev.Rank != 2 || ev.Event != "dead" || ev.Epoch != 2 || ev.Reason == "" {
		t.Errorf("event %+v: want rank 2 dead in epoch 1 with a reason", ev)
	}
	t.Logf("death recorded: %+v", ev)
	if r := sum.Ranks[2]; r.State != record.RankDead {
		t.Errorf("rank 2 %+v, want dead", r)
	}
	checkDeathRecord(t, out, sum, 2)
	for _, r := range []int{0, 1, 3} {
		if sum.Ranks[r].State != record.RankExited {
			t.Errorf("rank %d %+v, want exited", r, sum.Ranks[r])
		}
	}
	led := readLedger(t, ledger)
	for e := uint64(0); e < 2; e++ {
		var missing, twice, overlap int
		for i := uint64(0); i < samples; i++ {
			by := led[e][i]
			survivors := slices.DeleteFunc(slices.Clone(by), func(r uint32) bool { return r == 2 })
			switch {
			case len(by) == 0:
				missing++
			case len(survivors) > 1:
				twice++
			case len(by) > 1:
				overlap++
			}
		}
		t.Logf("epoch %d: %d samples in the ledger, %d missing, %d trained twice by survivors, %d by the dead rank and a survivor",
			e, len(led[e]), missing, twice, overlap)
		if missing > 0 || twice > 0 || overlap > batch || (e == 0 && overlap > 0) {
			t.Errorf("epoch %d is not trained exactly once", e)
		}
	}
}

// The third must-show: SIGINT mid-epoch stops the run within seconds with
// a complete checkpoint; --resume finishes it, and the model equals an
// uninterrupted run's bit for bit (same seed, sync policy).
//
// The second case keeps the controller busy (a divergence target no round
// reaches, so the interval grows every few rounds across the epochs): the
// resumed run must make the original's decisions from the save point on.
// The third averages with averaging-cpu and its default smoothing, whose
// filter state must cross the cut with the checkpoint.
func TestRunInterruptAndResume(t *testing.T) {
	for _, tc := range []struct{ name, coordinator, averager string }{
		{"default controller", "", `averager "mock" {}`},
		{"controller moving", "divergence_target = 100\n  sync_every_max = 16", `averager "mock" {}`},
		{"cpu averager smoothing", "", `averager "cpu" {}`},
	} {
		t.Run(tc.name, func(t *testing.T) { interruptAndResume(t, tc.coordinator, tc.averager) })
	}
}

func interruptAndResume(t *testing.T, coordinatorKeys, averager string) {
	if strings.Contains(averager, `"cpu"`) {
		buildPlugin(t, "averaging-cpu")
	}
	trainer := map[string]any{"samples": 1024, "batch_size": 16, "sleep_per_batch": "5ms"}
	cfg := writeRunConfigAveraging(t, `run { seed = 11 }
coordinator {
  sync_every       = 4
  checkpoint_every = 3
  `+coordinatorKeys+`
}`, trainer, averager)
	args := func(out string, extra ...string) []string {
		return append([]string{"run", "--config", cfg, "--ranks", "2", "--epochs", "3", "--out", out}, extra...)
	}

	straight := filepath.Join(t.TempDir(), "straight")
	if code := startCohort(t, args(straight)...).wait(120 * time.Second); code != 0 {
		t.Fatalf("uninterrupted run: exit %d", code)
	}
	straightSum := readSummary(t, straight)
	want, wantSteps := mockParams(t, filepath.Join(straightSum.Checkpoint, "rank-0"), trainer)
	if coordinatorKeys != "" && len(straightSum.Controller.Decisions) == 0 {
		t.Fatalf("the controller made no decision in the uninterrupted run: %+v", straightSum.Controller)
	}

	cut := filepath.Join(t.TempDir(), "cut")
	p := startCohort(t, args(cut)...)
	p.waitLine("epoch 1/3", 60*time.Second)
	time.Sleep(60 * time.Millisecond)
	sent := time.Now()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	code := p.wait(30 * time.Second)
	took := time.Since(sent)
	t.Logf("SIGINT to exit: %v", took.Round(time.Millisecond))
	if code != exitStopped || took > 10*time.Second {
		t.Fatalf("exit %d after %v, want %d within seconds", code, took, exitStopped)
	}
	sum := readSummary(t, cut)
	if sum.Status != record.StatusStopped || sum.Checkpoint == "" || len(sum.Epochs) != 1 {
		t.Fatalf("stopped run: status %s, checkpoint %q, %d epochs", sum.Status, sum.Checkpoint, len(sum.Epochs))
	}
	meta, err := checkpoint.ReadMeta(sum.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Reason != checkpoint.ReasonInterrupted || !slices.Equal(meta.SavedRanks, []uint32{0, 1}) {
		t.Errorf("checkpoint meta: reason %q, saved ranks %v", meta.Reason, meta.SavedRanks)
	}
	var left uint64
	for _, rr := range meta.Remaining {
		for _, rg := range rr.Ranges {
			left += rg.Size
		}
	}
	t.Logf("stopped in epoch %d with %d of its 1024 samples left", meta.Epoch, left)
	if meta.Epoch != 1 || left == 0 || left >= 1024 {
		t.Fatalf("the stop did not land mid-epoch: epoch %d, %d samples left", meta.Epoch, left)
	}

	// The printed hint alone resumes it: the run's own config (2 ranks,
	// 3 epochs, its trainer settings), written on into its directory.
	hint := "resume with: cohort run --resume " + sum.Checkpoint
	if !strings.Contains(p.output(), hint) {
		t.Fatalf("the stopped run did not print %q:\n%s", hint, p.output())
	}
	if code := startCohort(t, "run", "--resume", sum.Checkpoint).wait(120 * time.Second); code != 0 {
		t.Fatalf("resumed run: exit %d", code)
	}
	resumed := readSummary(t, cut)
	if resumed.Status != record.StatusCompleted || len(resumed.Epochs) != 3 || resumed.ResumedFrom != sum.Checkpoint {
		t.Fatalf("resumed run: status %s, %d epochs, resumed from %q", resumed.Status, len(resumed.Epochs), resumed.ResumedFrom)
	}
	for r := range 2 {
		got, steps := mockParams(t, filepath.Join(resumed.Checkpoint, "rank-"+strconv.Itoa(r)), trainer)
		if !slices.Equal(got, want) || steps != wantSteps {
			t.Errorf("rank %d: the resumed model differs from the uninterrupted one (steps %d vs %d)", r, steps, wantSteps)
		}
	}
	if a, b := resumed.Controller, straightSum.Controller; a.Interval != b.Interval || a.LRScale != b.LRScale {
		t.Errorf("resumed controller ends at interval %d, lr scale %g; the uninterrupted one at %d, %g",
			a.Interval, a.LRScale, b.Interval, b.LRScale)
	}
	t.Logf("controller decisions: %d uninterrupted, %d before the cut, %d after", len(straightSum.Controller.Decisions),
		len(sum.Controller.Decisions), len(resumed.Controller.Decisions))
}

// A new run refuses an out directory that already holds a run, naming the
// way out; --force writes into it.
func TestRunRefusesAnOccupiedOut(t *testing.T) {
	cfg := writeRunConfig(t, "", map[string]any{"samples": 128, "batch_size": 16})
	out := filepath.Join(t.TempDir(), "run")
	run := func(extra ...string) *proc {
		return startCohort(t, append([]string{"run", "--config", cfg, "--ranks", "1", "--epochs", "1", "--out", out}, extra...)...)
	}
	if code := run().wait(60 * time.Second); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	p := run()
	if code := p.wait(30 * time.Second); code != exitUsage || !strings.Contains(p.stderrText(), "already holds a run") || !strings.Contains(p.stderrText(), "--force") {
		t.Fatalf("second run into %s: exit %d, stderr %q; want it refused", out, code, p.stderrText())
	}
	if code := run("--force").wait(60 * time.Second); code != 0 {
		t.Fatalf("--force: exit %d", code)
	}
}

// The fourth must-show, end to end: under cadence the fast rank does more
// batches per window and the ranks wait less at the sync than under sync.
// Rank 1 is made six times slower with the mock trainer's
// sleep_per_batch_by_rank (a ratio far from the cadence's cap of 64, so the
// epoch holds several calibrated windows, not a probe and one last window).
func TestRunCadenceOnUnequalRanks(t *testing.T) {
	trainer := map[string]any{"samples": 2048, "batch_size": 16, "sleep_per_batch": "2ms", "sleep_per_batch_by_rank": map[string]string{"1": "12ms"}}
	run := func(policy string) record.EpochSummary {
		cfg := writeRunConfig(t, fmt.Sprintf("coordinator {\n  policy = %q\n  sync_every = 4\n}", policy), trainer)
		out := filepath.Join(t.TempDir(), policy)
		if code := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "1", "--out", out).wait(120 * time.Second); code != 0 {
			t.Fatalf("%s: exit %d", policy, code)
		}
		return readSummary(t, out).Epochs[0]
	}
	s, c := run("sync"), run("cadence")
	t.Logf("sync:    wait %.2f ms, batches/window fast %.1f slow %.1f", s.WaitAtSyncMS, s.Ranks[0].BatchesPerWindow, s.Ranks[1].BatchesPerWindow)
	t.Logf("cadence: wait %.2f ms, batches/window fast %.1f slow %.1f", c.WaitAtSyncMS, c.Ranks[0].BatchesPerWindow, c.Ranks[1].BatchesPerWindow)
	if c.Ranks[0].BatchesPerWindow <= c.Ranks[1].BatchesPerWindow {
		t.Errorf("cadence: the fast rank did not do more batches per window")
	}
	if c.WaitAtSyncMS >= s.WaitAtSyncMS {
		t.Errorf("cadence waited %.2f ms at the sync, sync %.2f ms", c.WaitAtSyncMS, s.WaitAtSyncMS)
	}
}

// The exit status says how a command line fared: 2 for a command line or
// config file cohort cannot run, 1 for a run that could not start, 0 for
// help and version (exitCodes; a run's own outcomes are TestOutcome's).
func TestExitStatus(t *testing.T) {
	t.Setenv(envSecret, "")
	t.Setenv(envSecretFile, "")
	cfg := writeRunConfig(t, "", nil)
	cases := []struct {
		name string
		args []string
		code int
	}{
		{"no command", nil, exitUsage},
		{"unknown command", []string{"train"}, exitUsage},
		{"version", []string{"version"}, exitCompleted},
		{"--version", []string{"--version"}, exitCompleted},
		{"version with an argument", []string{"version", "extra"}, exitUsage},
		{"help", []string{"run", "--help"}, exitCompleted},
		{"run: stray argument", []string{"run", "extra"}, exitUsage},
		{"run: unknown flag", []string{"run", "--world", "2"}, exitUsage},
		{"run: no secret file of its own", []string{"run", "--secret-file", "s"}, exitUsage},
		{"run: bad flag value", []string{"run", "--ranks", "two"}, exitUsage},
		{"run: zero ranks", []string{"run", "--ranks", "0"}, exitUsage},
		{"run: missing config", []string{"run", "--config", "/nonexistent/cohort.hcl"}, exitUsage},
		{"run: typo'd key", []string{"run", "--config", writeFile(t, "run {\n  rank = 2\n}\n")}, exitUsage},
		{"run: wrong type", []string{"run", "--config", writeFile(t, "run {\n  ranks = \"two\"\n}\n")}, exitUsage},
		{"run: syntax error", []string{"run", "--config", writeFile(t, "run {\n  ranks = \n}\n")}, exitUsage},
		{"validate: no file", []string{"validate"}, exitUsage},
		{"validate: missing file", []string{"validate", "/nonexistent/cohort.hcl"}, exitUsage},
		{"worker: typo'd key", []string{"worker", "--config", writeFile(t, "worker {\n  plugin_dirs = \"x\"\n}\n"), "--rank", "0", "--world", "1", "--coordinator", "127.0.0.1:1"}, exitUsage},
		{"coordinator: no config", []string{"coordinator", "--listen", "127.0.0.1:0"}, exitUsage},
		{"coordinator: no listen", []string{"coordinator", "--config", cfg}, exitUsage},
		{"coordinator: bad listen", []string{"coordinator", "--config", cfg, "--listen", "nowhere"}, exitUsage},
		{"coordinator: no secret", []string{"coordinator", "--config", cfg, "--listen", "127.0.0.1:0"}, exitFailed},
		{"plugins: missing config", []string{"plugins", "--config", "/nonexistent/cohort.hcl"}, exitUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code := execute(tc.args); code != tc.code {
				t.Fatalf("cohort %q: exit %d, want %d", tc.args, code, tc.code)
			}
		})
	}
}

// -v counts wherever it stands, and each command maps the count to its
// log level; the launcher hands the same count to its workers.
func TestVerbosity(t *testing.T) {
	cases := []struct {
		args          []string
		count         int
		passed        []string
		run, worker   hclog.Level
		coordinatorAt hclog.Level
	}{
		{[]string{"run", "--ranks", "2"}, 0, nil, hclog.Warn, hclog.Info, hclog.Info},
		{[]string{"-v", "run", "--ranks", "2", "-v"}, 2, []string{"-vv"}, hclog.Debug, hclog.Trace, hclog.Debug},
		{[]string{"worker", "-vvv"}, 3, []string{"-vvv"}, hclog.Trace, hclog.Trace, hclog.Trace},
		{[]string{"coordinator", "--verbose", "-vvvv"}, 5, []string{"-vvv"}, hclog.Trace, hclog.Trace, hclog.Trace},
		{[]string{"run", "-v"}, 1, []string{"-v"}, hclog.Info, hclog.Debug, hclog.Info},
	}
	for _, tc := range cases {
		root := newRootCommand()
		cmd, rest, err := root.Find(tc.args)
		if err == nil {
			err = cmd.ParseFlags(rest)
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		n, err := cmd.Flags().GetCount("verbose")
		if err != nil || n != tc.count {
			t.Errorf("%q: -v count %d (%v), want %d", tc.args, n, err, tc.count)
		}
		g := &globals{verbosity: n}
		if got := g.verbosityFlag(); !slices.Equal(got, tc.passed) {
			t.Errorf("%q: workers get %q, want %q", tc.args, got, tc.passed)
		}
		for _, l := range []struct {
			levels logLevels
			want   hclog.Level
		}{{runLogLevels, tc.run}, {workerLogLevels, tc.worker}, {coordinatorLogLevels, tc.coordinatorAt}} {
			if got := g.newLogger(io.Discard, l.levels).GetLevel(); got != l.want {
				t.Errorf("%q: level %v, want %v", tc.args, got, l.want)
			}
		}
	}
}

// The first signal asks for a clean stop (or, with no stop, cancels); the
// next abandons; release joins and lets later signals go.
func TestOnSignals(t *testing.T) {
	for _, tc := range []struct {
		name         string
		withStop     bool
		signals      int
		stops        int
		cancelled    bool
		causeContain string
	}{
		{"one, with stop", true, 1, 1, false, ""},
		{"two, with stop", true, 2, 1, true, "again: abandoned"},
		{"one, no stop", false, 1, 0, true, "user defined signal 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stops := make(chan os.Signal, 4)
			var stop func(os.Signal)
			if tc.withStop {
				stop = func(s os.Signal) { stops <- s }
			}
			ctx, release := onSignals(context.Background(), stop, syscall.SIGUSR1)
			defer release()
			for range tc.signals {
				if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
					t.Fatal(err)
				}
				// Signals are delivered one at a time, so each is counted.
				time.Sleep(50 * time.Millisecond)
			}
			if len(stops) != tc.stops {
				t.Errorf("stop called %d times, want %d", len(stops), tc.stops)
			}
			if (ctx.Err() != nil) != tc.cancelled {
				t.Fatalf("cancelled: %v, want %v", ctx.Err() != nil, tc.cancelled)
			}
			if tc.cancelled && !strings.Contains(context.Cause(ctx).Error(), tc.causeContain) {
				t.Errorf("cause %q lacks %q", context.Cause(ctx), tc.causeContain)
			}
			release()
			if ctx.Err() == nil {
				t.Error("release left the context live")
			}
			release() // a second release is harmless
		})
	}
}

// outcome prints a run's end and picks the exit status.
func TestOutcome(t *testing.T) {
	acc := 0.8539
	epochs := []record.EpochSummary{{Accuracy: &acc}}
	for _, tc := range []struct {
		name  string
		sum   *record.Summary
		err   error
		code  int
		lines []string
	}{
		{"completed", &record.Summary{Status: record.StatusCompleted, Epochs: epochs, Checkpoint: "out/ck/3"}, nil, exitCompleted,
			[]string{"run completed; final test accuracy 85.39%; last checkpoint out/ck/3"}},
		{"stopped", &record.Summary{Status: record.StatusStopped, Checkpoint: "out/ck/1"}, nil, exitStopped,
			[]string{"run stopped; last checkpoint out/ck/1", "resume with: cohort run --resume out/ck/1"}},
		{"stopped before a checkpoint", &record.Summary{Status: record.StatusStopped}, nil, exitStopped,
			[]string{"run stopped"}},
		{"failed", &record.Summary{Status: "failed"}, errors.New("every rank lost"), exitFailed,
			[]string{"run failed"}},
		{"failed after saving", &record.Summary{Status: "failed", Checkpoint: "out/ck/2"}, errors.New("1 live rank, min_ranks is 2"), exitFailed,
			[]string{"run failed; last checkpoint out/ck/2", "resume with: cohort run --resume out/ck/2"}},
		{"never ran", nil, errors.New("listen: address in use"), exitFailed, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := outcome(&out, tc.sum, tc.err, "cohort run")
			code := exitCompleted
			var e *exitError
			if errors.As(err, &e) {
				code = e.code
				if tc.err != nil && !errors.Is(err, tc.err) {
					t.Errorf("error %v does not carry %v", err, tc.err)
				}
			} else if err != nil {
				t.Fatalf("error %v carries no exit status", err)
			}
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"); tc.lines != nil && !slices.Equal(got, tc.lines) {
				t.Errorf("printed %q, want %q", got, tc.lines)
			}
		})
	}
}

func TestPrefixWriterKeepsLinesWhole(t *testing.T) {
	var buf bytes.Buffer
	w := &prefixWriter{prefix: "[rank 3] ", w: &buf}
	io.WriteString(w, "first li")
	io.WriteString(w, "ne\nsecond\nthi")
	w.flush()
	want := "[rank 3] first line\n[rank 3] second\n[rank 3] thi\n"
	if buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
}

// The workers get the secret through the environment, one source only,
// and the marker that leaves Ctrl-C to the launcher.
func TestChildEnv(t *testing.T) {
	t.Setenv(envSecretFile, "/elsewhere")
	t.Setenv(envSecret, "stale")
	env := childEnv([]byte("the-run-secret-0123456789"))
	var secrets, files, child []string
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, envSecret+"="):
			secrets = append(secrets, kv)
		case strings.HasPrefix(kv, envSecretFile+"="):
			files = append(files, kv)
		case strings.HasPrefix(kv, envRunChild+"="):
			child = append(child, kv)
		}
	}
	if !slices.Equal(secrets, []string{envSecret + "=the-run-secret-0123456789"}) || len(files) != 0 || !slices.Equal(child, []string{envRunChild + "=1"}) {
		t.Errorf("secret %q, secret file %q, child marker %q", secrets, files, child)
	}
}

// procStat returns a process's parent pid and process group, false when
// the process is gone (or a zombie).
func procStat(pid int) (ppid, pgrp int, ok bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 3 || f[0] == "Z" {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	pgrp, _ = strconv.Atoi(f[2])
	return ppid, pgrp, true
}

// groupAlive reports whether any process is left in process group pgrp.
func groupAlive(pgrp int) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, g, ok := procStat(pid); ok && g == pgrp {
			return true
		}
	}
	return false
}

// Workers run in process groups of their own (a terminal's Ctrl-C reaches
// only the launcher); a second SIGINT kills them, and nothing the run
// started (workers, their plugins) outlives the launcher.
func TestRunSecondInterruptKillsEverything(t *testing.T) {
	cfg := writeRunConfig(t, "coordinator {\n  sync_every = 2\n}", map[string]any{"samples": 4096, "batch_size": 16, "sleep_per_batch": "20ms"})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "5", "--out", filepath.Join(t.TempDir(), "run"))
	p.waitLine("cohort formed", 60*time.Second)
	var groups []int
	for r := range 2 {
		pid := workerPID(t, p.cmd.Process.Pid, r)
		if _, pgrp, ok := procStat(pid); !ok || pgrp != pid {
			t.Fatalf("worker %d (pid %d) is in process group %d, want its own", r, pid, pgrp)
		}
		groups = append(groups, pid)
	}
	p.cmd.Process.Signal(os.Interrupt)
	time.Sleep(20 * time.Millisecond)
	p.cmd.Process.Signal(os.Interrupt)
	if code := p.wait(15 * time.Second); code == exitCompleted {
		t.Fatalf("exit %d after two interrupts", code)
	}
	for _, g := range groups {
		if groupAlive(g) {
			t.Errorf("process group %d (a worker and its plugins) outlived the launcher", g)
		}
	}
}

// A `cohort run` SIGKILLed mid-run takes its workers with it (Pdeathsig),
// and they remove their arenas on the way out, although the pipe their
// logs went to has no reader any more.
func TestRunKilledLeavesNoArena(t *testing.T) {
	cfg := writeRunConfig(t, "coordinator {\n  sync_every = 2\n}", map[string]any{"samples": 4096, "batch_size": 16, "sleep_per_batch": "20ms"})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "5", "--out", filepath.Join(t.TempDir(), "run"))
	p.waitLine("cohort formed", 60*time.Second)
	var runID string
	if _, err := fmt.Sscanf(p.output(), "run %s", &runID); err != nil {
		t.Fatalf("no run id in %q: %v", p.output(), err)
	}
	runID = strings.TrimSuffix(runID, ":")
	arenas := func() []string {
		m, _ := filepath.Glob(filepath.Join(arena.DefaultDir, "cohort-"+runID+"-r*.arena"))
		return m
	}
	var groups []int
	for r := range 2 {
		groups = append(groups, workerPID(t, p.cmd.Process.Pid, r))
	}
	if got := arenas(); len(got) != 2 {
		t.Fatalf("arenas of run %s: %q, want one per rank", runID, got)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(15 * time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && (len(arenas()) > 0 || slices.ContainsFunc(groups, groupAlive)) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := arenas(); len(got) > 0 {
		t.Errorf("arenas left after the launcher was killed: %q", got)
	}
	for _, g := range groups {
		if groupAlive(g) {
			t.Errorf("process group %d (a worker and its plugins) outlived the killed launcher", g)
		}
	}
}

// `cohort coordinator` alone, with workers started apart as on other
// hosts: the address comes from its first line, the secret from the
// environment of each process.
func TestCoordinatorCommandWithSeparateWorkers(t *testing.T) {
	bin := cohortBinary(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := writeRunConfig(t, "run {\n  ranks  = 2\n  epochs = 2\n}", map[string]any{"samples": 512})
	secret := envSecret + "=separate-processes-secret-0123456789"
	coord := exec.Command(bin, "coordinator", "--config", cfg, "--listen", "127.0.0.1:0", "--out", out)
	coord.Env = append(os.Environ(), secret, envSecretFile+"=")
	stdout, err := coord.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	logs := &lockedWriter{w: &logBuf}
	coord.Stderr = logs
	if err := coord.Start(); err != nil {
		t.Fatal(err)
	}
	defer coord.Process.Kill()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatal("the coordinator printed nothing")
	}
	first := sc.Text()
	var addr string
	if _, err := fmt.Sscanf(first, "coordinator listening on %s", &addr); err != nil {
		t.Fatalf("first line %q: %v", first, err)
	}
	go io.Copy(io.Discard, stdout)
	var workers []*exec.Cmd
	for r := range 2 {
		w := exec.Command(bin, "worker", "--coordinator", addr, "--rank", strconv.Itoa(r), "--world", "2", "--config", cfg)
		w.Env = append(os.Environ(), secret, envSecretFile+"=")
		w.Stderr = logs
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		defer w.Process.Kill()
		workers = append(workers, w)
	}
	errc := make(chan error, 1)
	go func() { errc <- coord.Wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("coordinator: %v\n%s", err, logs.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the coordinator did not finish\n%s", logs.String())
	}
	for r, w := range workers {
		if err := w.Wait(); err != nil {
			t.Errorf("worker %d: %v", r, err)
		}
	}
	if sum := readSummary(t, out); sum.Status != record.StatusCompleted || len(sum.Epochs) != 2 {
		t.Errorf("summary: status %s, %d epochs", sum.Status, len(sum.Epochs))
	}
}

// A worker that cannot start (here: its trainer cannot open the ledger
// file its settings name, which only Configure tries) fails the run at
// once, naming the rank, instead of waiting out the formation timeout.
func TestRunFailsFastWhenAWorkerCannotStart(t *testing.T) {
	cfg := writeRunConfig(t, "", map[string]any{"ledger": filepath.Join(t.TempDir(), "no", "such", "ledger")})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "1", "--out", filepath.Join(t.TempDir(), "run"))
	start := time.Now()
	if code := p.wait(30 * time.Second); code != exitFailed {
		t.Fatalf("exit %d, want %d", code, exitFailed)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("failing took %v", d)
	}
	if !strings.Contains(p.stderrText(), "exited (exit status 1) before the cohort formed") {
		t.Errorf("stderr does not say which worker failed:\n%s", tail(p.stderrText(), 2000))
	}
}

// TestEpochLine: the progress line of a finished epoch names its accuracy
// only when the trainer evaluated, and its rounds only when it had any (a
// lone rank has none, and "sync 0.0 ms/round" would read as free rounds).
func TestEpochLine(t *testing.T) {
	acc := 0.8539
	for _, tc := range []struct {
		name      string
		s         record.EpochSummary
		want, not []string
	}{
		{"rounds", record.EpochSummary{Epoch: 3, Loss: 0.4066, Accuracy: &acc, Seconds: 1, Samples: 60000, Rounds: 24, MeanRoundMS: 6.5, WaitAtSyncMS: 3.25},
			[]string{"epoch 3/3", "accuracy 85.39%", "60000 samples/s", "24 rounds", "sync 6.5 ms/round", "wait 3.2 ms"}, []string{"no rounds"}},
		{"one round", record.EpochSummary{Epoch: 1, Loss: 0.5, Seconds: 1, Samples: 1, Rounds: 1},
			[]string{"1 sample ", "1 round "}, []string{"1 samples ", "1 rounds"}},
		{"lone rank", record.EpochSummary{Epoch: 1, Loss: 0.5, Seconds: 2, Samples: 60000},
			[]string{"epoch 1/3", "30000 samples/s", "no rounds"}, []string{"accuracy", "ms/round"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			line := epochLine(coordinator.Progress{Kind: coordinator.ProgressEpoch, Epochs: 3, Summary: &s})
			for _, w := range tc.want {
				if !strings.Contains(line, w) {
					t.Errorf("%q lacks %q", line, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(line, n) {
					t.Errorf("%q has %q", line, n)
				}
			}
		})
	}
}

// A trainer that reports an adaptive optimizer reaches the coordinator
// through its worker's Ready: with no divergence_target in the config, the
// run aims at the adaptive default, and at SGD's default otherwise.
func TestRunTargetFollowsTheTrainersOptimizer(t *testing.T) {
	for _, tc := range []struct {
		adaptive bool
		want     float64
	}{{false, dispatch.DivergenceTarget}, {true, dispatch.AdaptiveDivergenceTarget}} {
		trainer := map[string]any{"samples": 256, "batch_size": 16, "adaptive": tc.adaptive}
		cfg := writeRunConfigAveraging(t, `run { seed = 3 }`, trainer, `averager "mock" {}`)
		out := filepath.Join(t.TempDir(), "out")
		if code := startCohort(t, "run", "--config", cfg, "--ranks", "2", "--epochs", "1", "--out", out).wait(60 * time.Second); code != 0 {
			t.Fatalf("adaptive %v: exit %d", tc.adaptive, code)
		}
		if got := readSummary(t, out).Controller.DivergenceTarget; got != tc.want {
			t.Errorf("adaptive %v: the run aimed at %g, want %g", tc.adaptive, got, tc.want)
		}
	}
}
