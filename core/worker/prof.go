package worker

import (
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/resources"
)

// profile is where the main loop's time went, for the trace-level
// "worker-prof" line at teardown. Run time is inside Train; wait time is
// everything between plans, split at the moment the last round's parameters
// were adopted: before it the rank waited for the reduce and slow peers,
// after it for the coordinator's next dispatch.
type profile struct {
	run, wait             time.Duration
	preUpdate, postUpdate time.Duration
	computeMS, dataMS     float64
	plans, rounds         int
	commands              int

	waitStart time.Time // zero while not waiting
	lastAdopt time.Time
}

// planDone counts a plan that trained for elapsed.
func (p *profile) planDone(elapsed time.Duration, st planStats) {
	p.run += elapsed
	p.computeMS += st.computeMS
	p.dataMS += st.dataMS
	p.plans++
}

func (w *worker) beginWait(t time.Time) { w.prof.waitStart = t }

func (w *worker) endWait(t time.Time) {
	p := &w.prof
	if p.waitStart.IsZero() {
		return
	}
	d := t.Sub(p.waitStart)
	p.wait += d
	if p.lastAdopt.After(p.waitStart) {
		p.preUpdate += p.lastAdopt.Sub(p.waitStart)
		p.postUpdate += t.Sub(p.lastAdopt)
	} else {
		p.preUpdate += d
	}
	p.waitStart = time.Time{}
}

// logProfile writes the one-line time and memory profile at trace level.
func (w *worker) logProfile() {
	if !w.log.IsTrace() {
		return
	}
	p := &w.prof
	sec := func(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }
	msec := func(v float64) string { return fmt.Sprintf("%.2fs", v/1e3) }
	total := max(p.run+p.wait, time.Nanosecond)
	pct := func(d time.Duration) string { return fmt.Sprintf("%.0f%%", 100*float64(d)/float64(total)) }
	other := max(p.run-time.Duration((p.computeMS+p.dataMS)*float64(time.Millisecond)), 0)
	args := []any{
		"run", sec(p.run), "run_share", pct(p.run),
		"wait", sec(p.wait), "wait_share", pct(p.wait),
		"compute", msec(p.computeMS), "data", msec(p.dataMS), "other", sec(other),
		"wait_pre_update", sec(p.preUpdate), "wait_post_update", sec(p.postUpdate),
		"plans", p.plans, "rounds", p.rounds, "commands", p.commands,
	}
	if m, err := resources.SelfMemory(); err == nil {
		gb := func(b uint64) string { return fmt.Sprintf("%.3fGB", float64(b)/(1<<30)) }
		args = append(args, "rss", gb(m.RSS), "pss", gb(m.PSS), "private", gb(m.Private), "shared", gb(m.Shared))
	} else {
		args = append(args, "memory", err.Error())
	}
	w.log.Trace("worker-prof", args...)
}
