package faults

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// `cohort coordinator` SIGKILLed or SIGSTOPped under separately started
// workers, as on other hosts: each worker ends with an error exit (not a
// signal), its plugins gone and its arena removed; at once when the
// connection breaks (kill), within worker.liveness_timeout when the
// coordinator falls silent (stop). The run resumes from its last
// checkpoint under `cohort run --resume`.
func TestCoordinatorKilled(t *testing.T) {
	for name, sig := range map[string]syscall.Signal{"SIGKILL": syscall.SIGKILL, "SIGSTOP": syscall.SIGSTOP} {
		t.Run(name, func(t *testing.T) { coordinatorFault(t, sig) })
	}
}

func coordinatorFault(t *testing.T, sig syscall.Signal) {
	const liveness = 2 * time.Second
	r := newRun(t, 2, 4, 512, "  checkpoint_every = 1\n  sync_every = 2", "  liveness_timeout = \"2s\"",
		map[string]any{"sleep_per_batch": "10ms"}, nil)
	coord := start(t, "cohort coordinator", "coordinator", "-v", "--config", r.cfg, "--listen", "127.0.0.1:0", "--out", r.out)
	var addr string
	if _, err := sscanf(coord.waitLine("coordinator listening on", 30*time.Second), "coordinator listening on %s", &addr); err != nil {
		t.Fatal(err)
	}
	var ws []*proc
	for rank := range 2 {
		ws = append(ws, start(t, "worker "+strconv.Itoa(rank), "worker", "--coordinator", addr, "--rank", strconv.Itoa(rank), "--world", "2", "--config", r.cfg))
	}
	coord.waitLine("checkpoint", 30*time.Second)
	if err := coord.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for rank, w := range ws {
		code := w.exit(liveness + 5*time.Second)
		took := time.Since(killed)
		t.Logf("worker %d: exit %d %v after the coordinator's death", rank, code, took.Round(time.Millisecond))
		if code <= 0 || w.status.Signaled() {
			t.Errorf("worker %d: exit %d (%v), want an error exit of its own", rank, code, w.status)
		}
		if took > liveness+2*time.Second {
			t.Errorf("worker %d took %v to notice, liveness timeout %v", rank, took, liveness)
		}
		if !strings.Contains(w.output(), "liveness") && !strings.Contains(w.output(), "coordinator") {
			t.Errorf("worker %d does not say why it ended", rank)
		}
	}
	coord.cmd.Process.Kill() // a stopped coordinator
	coord.exit(10 * time.Second)
	checkNothingLeft(t, "", 10*time.Second)
	if arenas := arenasOf(t); len(arenas) > 0 {
		t.Errorf("arenas left: %q", arenas)
	}
	checkLoads(t, r)
	p := r.launch(true)
	id := runID(t, p)
	if code := p.exit(60 * time.Second); code != 0 {
		t.Fatalf("resume: exit %d", code)
	}
	r.checkCompleted()
	checkNothingLeft(t, id, 10*time.Second)
}

// Losing ranks below coordinator.min_ranks: the survivors save a
// checkpoint (reason too_few_ranks) and the run ends as failed, exit 1,
// its summary naming the checkpoint and the death; `cohort run` prints
// how to resume, and `--resume` (on the full cohort again) completes the
// run with every epoch trained and counted in full.
func TestTooFewRanks(t *testing.T) {
	r := newRun(t, 3, 3, 1536, "  min_ranks = 3\n  sync_every = 4\n  heartbeat_timeout = \"1s\"", "",
		map[string]any{"sleep_per_batch": "10ms"}, nil)
	p := r.launch(false)
	id := runID(t, p)
	p.waitLine("epoch 1/3", 30*time.Second)
	victim := workers(t, p.cmd.Process.Pid)[2]
	if victim == 0 {
		t.Fatal("no worker of rank 2")
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(30 * time.Second); code != 1 {
		t.Fatalf("exit %d, want 1 (failed)", code)
	}
	checkNothingLeft(t, id, 10*time.Second)
	sum := r.summary()
	if sum.Status != record.StatusFailed || sum.Checkpoint == "" {
		t.Fatalf("summary: status %s, checkpoint %q: want failed with a checkpoint", sum.Status, sum.Checkpoint)
	}
	if len(sum.MembershipEvents) != 1 || sum.MembershipEvents[0].Rank != 2 {
		t.Errorf("membership events %+v, want rank 2's death", sum.MembershipEvents)
	}
	m, err := checkpoint.ReadMeta(sum.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if m.Reason != checkpoint.ReasonTooFewRanks || len(m.SavedRanks) != 2 {
		t.Errorf("checkpoint reason %q, saved ranks %v: want too_few_ranks by ranks 0 and 1", m.Reason, m.SavedRanks)
	}
	if !strings.Contains(p.output(), "resume with: cohort run --resume "+sum.Checkpoint) {
		t.Error("cohort run does not say how to resume")
	}
	checkLoads(t, r)
	p = r.launch(true)
	id = runID(t, p)
	if code := p.exit(60 * time.Second); code != 0 {
		t.Fatalf("resume: exit %d", code)
	}
	r.checkCompleted()
	checkNothingLeft(t, id, 10*time.Second)
}
