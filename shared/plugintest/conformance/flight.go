package conformance

import (
	"context"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

// flight is rounds started on some ranks and not yet awaited: the checks
// of what ends a round in flight.
type flight struct {
	c      *cohort
	idx    []int
	cancel context.CancelFunc
	done   []chan struct{}
	res    []plugin.RoundResult
	errs   []error
}

// settle is how long a check lets rounds reach their wait for the missing
// peer before it acts on them.
const settle = 200 * time.Millisecond

// launch starts round n (steps 1) on the listed ranks and lets it settle.
func (c *cohort) launch(idx []int, n uint64) *flight {
	ctx, cancel := context.WithTimeout(context.Background(), CallBound)
	f := &flight{c: c, idx: idx, cancel: cancel, done: make([]chan struct{}, len(idx)),
		res: make([]plugin.RoundResult, len(idx)), errs: make([]error, len(idx))}
	for i, r := range idx {
		f.done[i] = make(chan struct{})
		go func() {
			defer close(f.done[i])
			f.res[i], f.errs[i] = c.ranks[r].avg.Average(ctx, plugin.Round{Round: n, Steps: 1})
		}()
	}
	c.t.Cleanup(f.join)
	time.Sleep(settle)
	return f
}

// returned reports whether idx[i]'s round has returned, waiting until
// deadline at most.
func (f *flight) returned(i int, deadline time.Time) bool {
	select {
	case <-f.done[i]:
		return true
	case <-time.After(time.Until(deadline)):
		return false
	}
}

// join ends the flight: it aborts the ranks whose rounds are still
// running, cancels their context and waits for them. A round that outlives
// all that is reported and left running.
func (f *flight) join() {
	f.c.t.Helper()
	var running []int
	for i := range f.idx {
		select {
		case <-f.done[i]:
		default:
			running = append(running, i)
		}
	}
	for _, i := range running {
		r := f.c.ranks[f.idx[i]]
		if !r.down {
			ctx, cancel := context.WithTimeout(context.Background(), PromptBound)
			r.avg.Abort(ctx, "conformance suite: ending a round left in flight")
			cancel()
		}
	}
	f.cancel()
	deadline := time.Now().Add(grace)
	for _, i := range running {
		if !f.returned(i, deadline) {
			f.c.t.Errorf("rank %d's round returned neither after Abort nor %v after its context ended; it is left running", f.idx[i], grace)
		}
	}
}
