package main

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/status"
)

// coordinatorRestarts is how many times `cohort run` starts its
// coordinator again after it failed.
const coordinatorRestarts = 3

// comeBack starts a coordinator in place of prev when prev crashed (a
// failure of the coordinator, not of the run), on its address and
// resuming its run: the workers, which wait for it up to their liveness
// timeout, come back to it with their plugins and models. nil: the run
// ends with err.
func comeBack(opts coordinator.Options, prev *coordinator.Coordinator, err error, restarts *int, prog *progressPrinter) *coordinator.Coordinator {
	if !errors.Is(err, coordinator.ErrCrashed) || *restarts >= coordinatorRestarts {
		return nil
	}
	*restarts++
	why, _, _ := strings.Cut(err.Error(), "\n")
	ln, lerr := net.Listen("tcp", prev.Addr().String())
	if lerr != nil {
		prog.line(fmt.Sprintf("the coordinator failed (%s); cannot listen on its address again: %v", why, lerr))
		return nil
	}
	opts.Listener, opts.Resume = ln, prev.Out()
	next, nerr := coordinator.New(opts)
	if nerr != nil {
		prog.line(fmt.Sprintf("the coordinator failed (%s); cannot start another: %v", why, nerr))
		return nil
	}
	prog.line(fmt.Sprintf("the coordinator failed (%s); started another on %s (%d of %d), the workers come back to it",
		why, prev.Addr(), *restarts, coordinatorRestarts))
	return next
}

// liveCoordinator is `cohort run`'s coordinator now: after a failure, the
// one started in its place.
type liveCoordinator struct {
	p atomic.Pointer[coordinator.Coordinator]
}

func (c *liveCoordinator) Status() *status.Snapshot { return c.p.Load().Status() }
func (c *liveCoordinator) Stop()                    { c.p.Load().Stop() }
func (c *liveCoordinator) Close() error             { return c.p.Load().Close() }
