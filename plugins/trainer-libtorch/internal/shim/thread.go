package shim

import (
	"errors"
	"runtime"
	"sync"
)

// ErrThreadStopped is returned by Run once the thread has been stopped.
var ErrThreadStopped = errors.New("the trainer's compute thread has stopped")

// Thread is one OS thread, owned by a trainer for its lifetime, that
// runs every libtorch computation handed to it, one at a time. libtorch and
// the libraries under it keep state per OS thread (the OpenMP team and its
// thread count, OpenBLAS's buffers, the malloc arena that holds the
// tensors' memory); a gRPC handler lands on whatever thread the Go
// scheduler picks, so each Train used to start on a cold one.
type Thread struct {
	work    chan func()
	mu      sync.Mutex // guards stopped and the close of quit
	quit    chan struct{}
	done    chan struct{} // closed when the thread has exited
	stopped bool
}

func NewThread() *Thread {
	c := &Thread{work: make(chan func()), quit: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		// Never unlocked: the thread exits with the goroutine.
		runtime.LockOSThread()
		close(ready)
		defer close(c.done)
		for {
			select {
			case f := <-c.work:
				f()
			case <-c.quit:
				return
			}
		}
	}()
	<-ready
	return c
}

// Done is closed when the thread has exited.
func (c *Thread) Done() <-chan struct{} { return c.done }

// Run runs f on the thread and waits for it.
func (c *Thread) Run(f func()) error {
	fin := make(chan struct{})
	select {
	case c.work <- func() { defer close(fin); f() }:
	case <-c.quit:
		return ErrThreadStopped
	}
	<-fin
	return nil
}

// Stop ends the thread after the work it is running, if any; it does not
// wait for that work. Later Runs return ErrThreadStopped.
func (c *Thread) Stop() {
	c.mu.Lock()
	if !c.stopped {
		c.stopped = true
		close(c.quit)
	}
	c.mu.Unlock()
}
