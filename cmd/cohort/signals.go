package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// onSignals hands SIGINT and SIGTERM (or sigs, when given) to a command
// until release. The first calls stop, which should end the work cleanly;
// the next cancels the returned context with a cause naming the signal,
// abandoning the work. With stop nil the first signal cancels. release
// stops the handling, joins its goroutine and cancels the context; it may
// be called more than once.
func onSignals(parent context.Context, stop func(os.Signal), sigs ...os.Signal) (ctx context.Context, release func()) {
	if len(sigs) == 0 {
		sigs = []os.Signal{os.Interrupt, syscall.SIGTERM}
	}
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, sigs...)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		first := true
		for {
			select {
			case sig := <-ch:
				switch {
				case first && stop != nil:
					stop(sig)
				case first:
					cancel(fmt.Errorf("%v", sig))
				default:
					cancel(fmt.Errorf("%v again: abandoned", sig))
				}
				first = false
			case <-quit:
				return
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(ch)
			close(quit)
			<-done
			cancel(nil)
		})
	}
}

// stopRun is the first signal's work for a run's coordinator: say so, and
// stop after the plans in flight with a checkpoint. again says what a
// second signal does.
func stopRun(prog *progressPrinter, stop func(), again string) func(os.Signal) {
	return func(sig os.Signal) {
		prog.line(fmt.Sprintf("%v: stopping after the plans in flight; saving a checkpoint (again to %s)", sig, again))
		stop()
	}
}

// stopWatchdog bounds how long a signalled command takes to stop: once ctx
// ends, giveUp runs unless the returned stop is called within grace. A
// worker whose launcher died (Pdeathsig) must not outlive it, even when a
// bug holds its teardown. stop joins the watchdog; call it once the work
// has returned.
func stopWatchdog(ctx context.Context, grace time.Duration, giveUp func()) (stop func()) {
	stopped, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-stopped:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			giveUp()
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stopped)
			<-done
		})
	}
}
