package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cohortdl/cohort/shared/plugin"
)

// errRoundAborted is the cause a round's context is cancelled with when the
// watchdog aborts it; errPeerDied fails a round whose session has a dead
// member before it starts.
var (
	errRoundAborted = errors.New("averaging round aborted")
	errPeerDied     = errors.New("a peer rank died")
)

// ledger is the rank's local view of which ranks are dead. The inbound
// bridge writes it (DeclareDead, or every peer when the coordinator is
// lost); the watchdog and the round read it.
type ledger struct {
	mu      sync.Mutex
	dead    []bool
	gen     uint64        // +1 each time a rank newly dies
	changed chan struct{} // wakes the watchdog
}

func newLedger(world uint32) *ledger {
	return &ledger{dead: make([]bool, world), changed: make(chan struct{}, 1)}
}

// mark records rank as dead; it reports whether that is news. A rank out of
// range is an error, never a panic: it came off the wire.
func (l *ledger) mark(rank uint32) (bool, error) {
	l.mu.Lock()
	if int(rank) >= len(l.dead) {
		l.mu.Unlock()
		return false, fmt.Errorf("rank %d out of range for world size %d", rank, len(l.dead))
	}
	news := !l.dead[rank]
	if news {
		l.dead[rank] = true
		l.gen++
	}
	l.mu.Unlock()
	if news {
		l.wake()
	}
	return news, nil
}

// markAllExcept marks every rank but self dead: the coordinator is gone, so
// no peer will show up for a round again.
func (l *ledger) markAllExcept(self uint32) {
	l.mu.Lock()
	news := false
	for r := range l.dead {
		if uint32(r) != self && !l.dead[r] {
			l.dead[r] = true
			news = true
		}
	}
	if news {
		l.gen++
	}
	l.mu.Unlock()
	if news {
		l.wake()
	}
}

// reset marks every rank alive again, for a coordinator that came back. It
// is no news for the watchdog: nobody died.
func (l *ledger) reset() {
	l.mu.Lock()
	clear(l.dead)
	l.mu.Unlock()
}

func (l *ledger) wake() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// snapshot returns the generation and the dead ranks.
func (l *ledger) snapshot() (uint64, []uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var dead []uint32
	for r, d := range l.dead {
		if d {
			dead = append(dead, uint32(r))
		}
	}
	return l.gen, dead
}

// deadAmong returns the members that are dead.
func (l *ledger) deadAmong(members []uint32) []uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []uint32
	for _, m := range members {
		if int(m) < len(l.dead) && l.dead[m] {
			out = append(out, m)
		}
	}
	return out
}

// mailbox holds the latest NewSession not yet applied to the averager.
type mailbox struct {
	mu sync.Mutex
	s  *plugin.Session
}

func (m *mailbox) put(s plugin.Session) {
	m.mu.Lock()
	m.s = &s
	m.mu.Unlock()
}

func (m *mailbox) take() *plugin.Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.s
	m.s = nil
	return s
}

// roundGuard lets the watchdog reach the round in flight.
type roundGuard struct {
	mu      sync.Mutex
	cancel  context.CancelCauseFunc // nil between rounds
	aborted error                   // set when the watchdog aborted this round
	count   uint64                  // the watchdog's aborts so far
}

// aborts is how many times the watchdog has aborted the averager.
func (g *roundGuard) aborts() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.count
}

// begin registers a round; cancel ends its context.
func (g *roundGuard) begin(cancel context.CancelCauseFunc) {
	g.mu.Lock()
	g.cancel, g.aborted = cancel, nil
	g.mu.Unlock()
}

// end unregisters the round and returns why the watchdog aborted it (nil
// if it did not).
func (g *roundGuard) end() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	why := g.aborted
	g.cancel, g.aborted = nil, nil
	return why
}

// abort counts an abort, marks the round in flight, if any, as aborted and
// returns its cancel function (nil when no round is in flight).
func (g *roundGuard) abort(why error) context.CancelCauseFunc {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.count++
	if g.cancel == nil {
		return nil
	}
	if g.aborted == nil {
		g.aborted = why
	}
	return g.cancel
}

// watchdog aborts the averaging round in flight whenever the ledger gains a
// dead peer. It calls the averager's Abort even between rounds: a backend
// whose session is broken by the death should fail its next round at once
// rather than wait for a peer that will not come. The round's context is
// cancelled too, so a backend that missed the Abort still lets go.
//
// A stop (Shutdown, ShutdownWithSave, a lost coordinator) aborts the round
// once as well, so that a round stalled without any death cannot keep the
// main loop from the stop.
func (w *worker) watchdog(ctx context.Context) {
	var seen uint64
	stopped := w.stopCtx.Done()
	for {
		var reason string
		select {
		case <-ctx.Done():
			return
		case <-stopped:
			stopped = nil
			reason = "rank stopping: " + context.Cause(w.stopCtx).Error()
		case <-w.ledger.changed:
			gen, dead := w.ledger.snapshot()
			if gen == seen {
				continue
			}
			seen = gen
			reason = fmt.Sprintf("ranks %v are dead", dead)
		}
		w.abortRound(ctx, reason)
	}
}

// abortRound aborts the averager and cancels the round in flight, if any.
func (w *worker) abortRound(ctx context.Context, reason string) {
	cancel := w.guard.abort(fmt.Errorf("%w: %s", errRoundAborted, reason))
	w.sup.AbortRound(ctx, reason, cancel != nil)
	if cancel != nil {
		cancel(errRoundAborted)
	}
}
