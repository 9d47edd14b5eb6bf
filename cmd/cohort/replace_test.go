package main

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// pluginPID waits for the plugin process named binary (cohort-trainer-mock,
// ...) that is a child of the worker pid, other than not, and returns it.
func pluginPID(t *testing.T, worker int, binary string, not int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range proctab.List() {
			if p.PID != not && p.PPID == worker && !p.Zombie() && len(p.Args) > 0 && filepath.Base(p.Args[0]) == binary {
				return p.PID
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %s under worker pid %d", binary, worker)
	return 0
}

// checkEveryoneTrained asserts that the ledger holds every sample of every
// epoch at least once and that the summary counts each epoch's data set
// exactly; it returns the samples trained more than once.
func checkEveryoneTrained(t *testing.T, sum *record.Summary, ledger string, samples uint64, epochs int) {
	t.Helper()
	led := readLedger(t, ledger)
	for e := range uint64(epochs) {
		var missing, twice int
		for i := range samples {
			switch n := len(led[e][i]); {
			case n == 0:
				missing++
			case n > 1:
				twice++
			}
		}
		t.Logf("epoch %d: %d missing, %d trained twice; summary counts %d samples", e, missing, twice, sum.Epochs[e].Samples)
		if missing > 0 {
			t.Errorf("epoch %d: %d samples never trained", e, missing)
		}
		if sum.Epochs[e].Samples != samples {
			t.Errorf("epoch %d: summary counts %d samples, the data set holds %d", e, sum.Epochs[e].Samples, samples)
		}
	}
}

// A SIGKILLed plugin is replaced, not fatal: the trainer killed in the
// middle of a plan (the plan's unreported samples go out again), the
// averager killed while its rank's rounds wait on a slow peer (the round
// runs again on a re-formed group). The run completes with every rank
// exiting cleanly, the summary records one plugin restart on the victim,
// and the ledger shows every sample of every epoch trained.
func TestRunReplacesKilledPlugin(t *testing.T) {
	const samples, batch, victim = 2048, 16, 2
	for _, tc := range []struct {
		kind, binary, policy string
		averager             string // the --averaging flag; "" keeps the mock
		trainer              map[string]any
		// inLog matches a worker log line that shows where the plugin was
		// lost.
		inLog string
	}{
		{kind: "trainer", binary: "cohort-trainer-mock", policy: "sync",
			// Most of a rank's time is in its plan, but the kill can land in
			// the Publish that ends it; either way the ledger must be whole.
			trainer: map[string]any{"sleep_per_batch": "10ms"},
			inLog:   `plan lost with the trainer|replacing a lost plugin with a fresh process: .*kind=trainer`},
		// Under async the rounds run beside training: the kill may land
		// while one is in flight, whose result the lost trainer cannot
		// take (the round runs again).
		{kind: "trainer", binary: "cohort-trainer-mock", policy: "async",
			trainer: map[string]any{"sleep_per_batch": "10ms"},
			inLog:   `plan lost with the trainer|replacing a lost plugin with a fresh process: .*kind=trainer`},
		// Under async, the fast ranks spend most of their time in rounds
		// waiting for rank 0's post.
		{kind: "averager", binary: "cohort-averaging-mock", policy: "async",
			trainer: map[string]any{"sleep_per_batch": "2ms", "sleep_per_batch_by_rank": map[string]string{"0": "25ms"}},
			inLog:   "averaging round aborted"},
		// averaging-cpu's replacement dials the reduce server again and
		// takes its rank's slot back.
		{kind: "averager", binary: "cohort-averaging-cpu", policy: "sync", averager: "cpu",
			trainer: map[string]any{"sleep_per_batch": "4ms"}, inLog: "averager"},
	} {
		t.Run(tc.kind+"/"+tc.binary+"/"+tc.policy, func(t *testing.T) {
			if tc.averager == "cpu" {
				buildPlugin(t, "averaging-cpu")
			}
			dir := t.TempDir()
			out, ledger := filepath.Join(dir, "run"), filepath.Join(dir, "ledger")
			settings := map[string]any{"samples": samples, "batch_size": batch, "ledger": ledger}
			for k, v := range tc.trainer {
				settings[k] = v
			}
			cfg := writeRunConfig(t, "coordinator {\n  policy = \""+tc.policy+"\"\n  sync_every = 4\n}\nworker {\n  plugin_restarts = 1\n}", settings)
			args := []string{"run", "--config", cfg, "--ranks", "3", "--epochs", "2", "--out", out, "-v"}
			if tc.averager != "" {
				args = append(args, "--averaging", tc.averager)
			}
			p := startCohort(t, args...)
			p.waitLine("epoch 1/2", 60*time.Second)
			time.Sleep(100 * time.Millisecond)
			sum := killAndComplete(t, p, pluginPID(t, workerPID(t, p.cmd.Process.Pid, victim), tc.binary, 0), out, 2)
			for _, r := range sum.Ranks {
				want := uint32(0)
				if r.Rank == victim {
					want = 1
				}
				if r.State != record.RankExited || r.PluginRestarts != want {
					t.Errorf("rank %+v: want exited with %d plugin restarts", r, want)
				}
			}
			if len(sum.MembershipEvents) != 1 {
				t.Fatalf("membership events %+v, want the one restart", sum.MembershipEvents)
			}
			ev := sum.MembershipEvents[0]
			if ev.Rank != victim || ev.Event != "plugin_restarted" || !strings.Contains(ev.Reason, tc.kind) {
				t.Errorf("event %+v: want rank %d's %s restart", ev, victim, tc.kind)
			}
			t.Logf("restart recorded: %+v", ev)
			if logs := p.stderrText(); !regexp.MustCompile(tc.inLog).MatchString(logs) {
				t.Errorf("the logs show nothing matching %q", tc.inLog)
			}
			checkEveryoneTrained(t, sum, ledger, samples, 2)
		})
	}
}

// Past worker.plugin_restarts the rank dies as it did before restarts
// existed: a budget of one survives the first kill of its trainer and
// dies of the second; the survivors finish every sample.
func TestRunPluginRestartBudget(t *testing.T) {
	const samples, batch, victim = 2048, 16, 1
	dir := t.TempDir()
	out, ledger := filepath.Join(dir, "run"), filepath.Join(dir, "ledger")
	cfg := writeRunConfig(t, "coordinator {\n  heartbeat_timeout = \"2s\"\n  sync_every = 4\n}\nworker {\n  plugin_restarts = 1\n}",
		map[string]any{"samples": samples, "batch_size": batch, "sleep_per_batch": "10ms", "ledger": ledger})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "3", "--epochs", "2", "--out", out)
	p.waitLine("epoch 1/2", 60*time.Second)
	worker := workerPID(t, p.cmd.Process.Pid, victim)
	first := pluginPID(t, worker, "cohort-trainer-mock", 0)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := pluginPID(t, worker, "cohort-trainer-mock", first)
	time.Sleep(150 * time.Millisecond)
	if err := syscall.Kill(second, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(90 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	sum := readSummary(t, out)
	if sum.Status != record.StatusCompleted {
		t.Fatalf("status %s", sum.Status)
	}
	events := make([]string, 0, len(sum.MembershipEvents))
	for _, ev := range sum.MembershipEvents {
		if ev.Rank != victim {
			t.Errorf("event %+v of another rank", ev)
		}
		events = append(events, ev.Event)
	}
	if !slices.Equal(events, []string{"plugin_restarted", "dead"}) {
		t.Fatalf("membership events %+v, want a restart, then the death", sum.MembershipEvents)
	}
	if r := sum.Ranks[victim]; r.State != record.RankDead || r.PluginRestarts != 1 {
		t.Errorf("rank %d %+v: want dead after 1 plugin restart", victim, r)
	}
	if !strings.Contains(p.stderrText(), "plugin restart budget spent") {
		t.Errorf("the logs do not say the restart budget was spent")
	}
	checkEveryoneTrained(t, sum, ledger, samples, 2)
}

// killAndComplete SIGKILLs pid (a worker or a plugin of the run p) and
// expects the run to complete anyway, with all its epochs; it returns the
// summary.
func killAndComplete(t *testing.T, p *proc, pid int, out string, epochs int) *record.Summary {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(90 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	sum := readSummary(t, out)
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != epochs {
		t.Fatalf("status %s, %d epochs; want completed with %d", sum.Status, len(sum.Epochs), epochs)
	}
	return sum
}
