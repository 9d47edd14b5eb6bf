package coordinator

import (
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// The clock's say in a run: the deadlines the loop sleeps until (formation,
// the exit after Shutdown, a session-id request), and what happens when
// one passes.

// checkDeadlines enforces every timeout the loop owns.
func (r *runner) checkDeadlines(now time.Time) {
	switch r.phase {
	case phForming:
		if !now.Before(r.formDeadline) {
			r.finish(record.StatusFailed, r.formationError())
		}
	case phShutdown, phSaving:
		if !now.Before(r.exitDeadline) {
			what := "Shutdown"
			if r.phase == phSaving {
				what = "ShutdownWithSave"
			}
			for _, id := range r.live() {
				r.noteDeath(id, fmt.Sprintf("no Exiting within %v of %s", r.c.exitTimeout(r.phase == phSaving), what))
			}
		}
	}
	if s := r.session; s != nil && !s.haveID && !now.Before(s.deadline) {
		r.retrySession()
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
	if s := r.session; s != nil && !s.haveID && (!ok || s.deadline.Before(next)) {
		next, ok = s.deadline, true
	}
	return next, ok
}
