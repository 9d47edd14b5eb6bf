package coordinator

import (
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// The clock's say in a run: the deadlines the loop sleeps until (formation,
// the exit after Shutdown, a session-id request), and what happens when
// one passes.

// checkDeadlines enforces every timeout the loop owns.
func (r *runner) checkDeadlines(now time.Time) {
	switch r.phase {
	case phForming:
		if !now.Before(r.formDeadline) {
			r.finish(record.StatusFailed, r.ranks.FormationError(r.cfg.Coordinator.FormationTimeout))
		}
	case phShutdown, phSaving:
		if !now.Before(r.exitDeadline) {
			what := "Shutdown"
			if r.phase == phSaving {
				what = "ShutdownWithSave"
			}
			for _, id := range r.ranks.Live() {
				r.ranks.NoteDeath(id, fmt.Sprintf("no Exiting within %v of %s", r.c.exitTimeout(r.phase == phSaving), what))
			}
		}
	}
	if err := r.sessions.Check(now); err != nil {
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_REDUCE_STALL, checkpoint.ReasonStall, record.StatusFailed, err)
	}
}

// nextDeadline is the nearest time checkDeadlines acts on in this state;
// ok is false when nothing waits on the clock (training with no session
// being established).
func (r *runner) nextDeadline() (next time.Time, ok bool) {
	switch r.phase {
	case phForming:
		next, ok = r.formDeadline, true
	case phShutdown, phSaving:
		next, ok = r.exitDeadline, true
	}
	if d, waits := r.sessions.Deadline(); waits && (!ok || d.Before(next)) {
		next, ok = d, true
	}
	return next, ok
}
