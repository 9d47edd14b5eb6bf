package faults

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// A worker SIGKILLed mid-epoch or mid-round, or SIGSTOPped: the
// coordinator declares it dead (at once for a kill, whose connection
// breaks; at heartbeat_timeout for a stop, whose connection stays open),
// gives its unfinished samples to the survivors, and the run completes
// with every sample of every epoch trained and counted. Nothing is left:
// the killed worker's plugins follow it, its arena is swept, and the
// stopped worker is killed by its launcher at the end of the run.
func TestWorkerFaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sig      syscall.Signal
		trainer  map[string]any
		averager map[string]any
		// inRound is a coordinator log line that shows the fault landed in
		// a round.
		inRound string
		reason  string
		after   time.Duration // from the end of the first epoch to the signal
		// inRoundOf, when set, waits after that for this worker log line
		// of rank 1's, so the signal lands in the round it begins.
		inRoundOf string
	}{
		{name: "SIGKILL mid-epoch", sig: syscall.SIGKILL, trainer: map[string]any{"sleep_per_batch": "10ms"}},
		{name: "SIGKILL mid-round", sig: syscall.SIGKILL, trainer: map[string]any{"sleep_per_batch": "1ms"},
			averager: map[string]any{"sleep_per_round": "150ms"}, after: 100 * time.Millisecond, inRound: "round will run again on the re-formed group",
			inRoundOf: "cohort.worker: round begins: rank=1 "},
		{name: "SIGSTOP", sig: syscall.SIGSTOP, trainer: map[string]any{"sleep_per_batch": "10ms"}, reason: "silent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRun(t, 3, 3, 1536, "  heartbeat_timeout = \"1s\"\n  sync_every = 4", "", tc.trainer, tc.averager)
			p := r.launch(false)
			id := runID(t, p)
			// Mid-way through the second epoch's first window.
			p.waitLine("epoch 1/3", 30*time.Second)
			time.Sleep(tc.after)
			if tc.inRoundOf != "" {
				// The averager sleeps 150 ms in every round: a signal sent
				// as rank 1 logs a round's start lands in it.
				p.waitOutput(tc.inRoundOf, len(p.output()), 30*time.Second)
			}
			victim := workers(t, p.cmd.Process.Pid)[1]
			if victim == 0 {
				t.Fatal("no worker of rank 1")
			}
			if err := syscall.Kill(victim, tc.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.exit(60 * time.Second); code != 0 {
				t.Fatalf("cohort run exit %d, want 0", code)
			}
			sum := r.checkCompleted()
			if len(sum.MembershipEvents) != 1 || sum.MembershipEvents[0].Rank != 1 || sum.Ranks[1].State != record.RankDead {
				t.Fatalf("membership events %+v, rank 1 %+v: want rank 1 dead", sum.MembershipEvents, sum.Ranks[1])
			}
			ev := sum.MembershipEvents[0]
			t.Logf("rank 1 dead in epoch %d: %s", ev.Epoch, ev.Reason)
			if tc.reason != "" && !strings.Contains(ev.Reason, tc.reason) {
				t.Errorf("reason %q lacks %q", ev.Reason, tc.reason)
			}
			if tc.inRound != "" && !strings.Contains(p.output(), tc.inRound) {
				t.Errorf("the kill did not land in a round: no %q in the log", tc.inRound)
			}
			checkNothingLeft(t, id, 10*time.Second)
		})
	}
}
