package worker

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"
)

// A command is one entry of the main loop's queue: a frame from the
// coordinator, or a stop the inbound bridge injected because the link
// failed (msg nil, err the reason).
type command struct {
	msg proto.Message
	err error
}

// queue is the main loop's unbounded FIFO. The inbound bridge must never
// block on it (it would stop reading the socket, and with it the liveness
// clock), so it grows instead.
type queue struct {
	mu    sync.Mutex
	items []command
	ready chan struct{} // holds a token while items is not empty
}

func newQueue() *queue { return &queue{ready: make(chan struct{}, 1)} }

func (q *queue) push(c command) {
	q.mu.Lock()
	q.items = append(q.items, c)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// tryPop takes the oldest command without waiting.
func (q *queue) tryPop() (command, bool) {
	return q.popIf(func(command) bool { return true })
}

// popIf takes the oldest command when ok says so.
func (q *queue) popIf(ok func(command) bool) (command, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 || !ok(q.items[0]) {
		return command{}, false
	}
	c := q.items[0]
	q.items[0] = command{}
	q.items = q.items[1:]
	if len(q.items) > 0 {
		// Keep the token for the rest.
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	return c, true
}

// peek returns the oldest command without taking it.
func (q *queue) peek() (command, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return command{}, false
	}
	return q.items[0], true
}

// pop waits for the oldest command or ctx's end.
func (q *queue) pop(ctx context.Context) (command, error) {
	for {
		if c, ok := q.tryPop(); ok {
			return c, nil
		}
		select {
		case <-q.ready:
		case <-ctx.Done():
			return command{}, ctx.Err()
		}
	}
}

// task is one owned goroutine: stop cancels it and waits for it to return.
type task struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func goTask(parent context.Context, f func(ctx context.Context)) *task {
	ctx, cancel := context.WithCancel(parent)
	t := &task{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		f(ctx)
	}()
	return t
}

// stop is safe on a nil task and idempotent.
func (t *task) stop() {
	if t == nil {
		return
	}
	t.cancel()
	<-t.done
}
