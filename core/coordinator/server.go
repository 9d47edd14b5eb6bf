package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/wire"
)

// eventKind says what an event from a connection's goroutines reports.
type eventKind int

const (
	evJoined   eventKind = iota // the handshake succeeded
	evMessage                   // a frame arrived
	evLinkDown                  // the connection failed or closed
)

// event is what the connection goroutines tell the loop. conn identifies
// the connection, so a late event of a replaced connection is ignored.
type event struct {
	kind eventKind
	rank uint32
	conn *wire.Conn
	msg  proto.Message
	err  error
}

// String names the event for Options.LoopTimer: a frame by its message
// name.
func (ev event) String() string {
	switch ev.kind {
	case evJoined:
		return "joined"
	case evLinkDown:
		return "link down"
	}
	if ev.msg == nil {
		return "frame"
	}
	return string(ev.msg.ProtoReflect().Descriptor().Name())
}

// slots records which ranks hold a connection, for the handshake's
// duplicate check. The loop releases a slot when it drops a rank that may
// connect again (before the cohort is formed).
type slots struct {
	mu    sync.Mutex
	world uint32
	taken map[uint32]bool
}

// reserve takes rank's slot or says why the hello is refused.
func (s *slots) reserve(h wire.Hello) error {
	if h.World != s.world {
		return fmt.Errorf("world size %d, this run has %d ranks", h.World, s.world)
	}
	if h.Rank >= s.world {
		return fmt.Errorf("rank %d is out of range for a world of %d", h.Rank, s.world)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.taken[h.Rank] {
		return fmt.Errorf("rank %d has already joined", h.Rank)
	}
	s.taken[h.Rank] = true
	return nil
}

func (s *slots) release(rank uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.taken, rank)
}

// server accepts rank connections, runs their handshakes and reads their
// frames; every goroutine it starts is tracked by wg.
type server struct {
	ln     net.Listener
	keys   wire.Keys
	slots  *slots
	opts   []wire.Option
	events chan<- event
	log    hclog.Logger
	wg     *sync.WaitGroup
}

// serve accepts until the listener is closed. Each connection gets its own
// goroutine, so a slow or hostile peer cannot hold up the others.
func (s *server) serve(ctx context.Context) {
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.log.Error("control server stopped accepting", "error", err)
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(ctx, nc)
		}()
	}
}

// handle runs one connection: the handshake, then its reader until the
// connection fails or ctx ends.
func (s *server) handle(ctx context.Context, nc net.Conn) {
	reserved := false
	var hello wire.Hello
	accept := func(h wire.Hello) error {
		if err := s.slots.reserve(h); err != nil {
			return err
		}
		reserved, hello = true, h
		return nil
	}
	conn, _, err := wire.ServerHandshake(ctx, nc, s.keys, accept, s.opts...)
	if err != nil {
		if reserved {
			// The hello was accepted but the ack could not be sent: the slot
			// is free again.
			s.slots.release(hello.Rank)
		}
		if ctx.Err() == nil {
			s.log.Warn("refused a rank connection", "remote", nc.RemoteAddr().String(), "reason", err.Error())
		}
		return
	}
	rank := hello.Rank
	// The reader ends only when the connection is of no further use (it
	// failed, fell silent, or the run is over), so closing it here is what
	// guarantees its writer goroutine ends, even for a connection the loop
	// never took.
	defer conn.Close()
	if !s.emit(ctx, event{kind: evJoined, rank: rank, conn: conn}) {
		return
	}
	for {
		msg, err := conn.Receive(ctx)
		if err != nil {
			s.emit(ctx, event{kind: evLinkDown, rank: rank, conn: conn, err: err})
			return
		}
		if !s.emit(ctx, event{kind: evMessage, rank: rank, conn: conn, msg: msg}) {
			return
		}
	}
}

func (s *server) emit(ctx context.Context, ev event) bool {
	select {
	case s.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// outboxSize bounds the frames queued for one rank. A rank that lets this
// many pile up is not reading; it is dropped rather than grow memory.
const outboxSize = 4096

// link is the loop's handle on one rank connection: a queue drained by one
// sender goroutine, so the loop never blocks on a slow peer and frames
// reach the rank in the order the loop queued them. The queue is a slice
// that grows with what is queued, not a channel of outboxSize slots: a
// thousand ranks' outboxes would hold 64 MB that a reading rank never
// uses.
type link struct {
	rank uint32
	conn *wire.Conn

	mu   sync.Mutex
	out  []proto.Message
	wake chan struct{} // holds a token while out may be non-empty
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newLink(rank uint32, conn *wire.Conn) *link {
	return &link{
		rank: rank,
		conn: conn,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// run sends queued frames until stopped; a failed send is reported as the
// link going down.
func (l *link) run(ctx context.Context, events chan<- event) {
	defer close(l.done)
	var batch []proto.Message
	for {
		select {
		case <-l.wake:
		case <-l.stop:
			return
		case <-ctx.Done():
			return
		}
		l.mu.Lock()
		batch, l.out = l.out, batch[:0]
		l.mu.Unlock()
		for i, msg := range batch {
			batch[i] = nil // sent frames are not kept alive by the reused slice
			if err := l.conn.Send(ctx, msg); err != nil {
				select {
				case events <- event{kind: evLinkDown, rank: l.rank, conn: l.conn, err: fmt.Errorf("send: %w", err)}:
				case <-ctx.Done():
				case <-l.stop:
				}
				return
			}
		}
		if cap(batch) > 64 {
			batch = nil // a burst's array goes back to the heap
		}
	}
}

// queue hands msg to the sender without blocking; false means the queue
// is full.
func (l *link) queue(msg proto.Message) bool {
	l.mu.Lock()
	n := len(l.out)
	if n < outboxSize {
		l.out = append(l.out, msg)
	}
	l.mu.Unlock()
	if n >= outboxSize {
		return false
	}
	select {
	case l.wake <- struct{}{}:
	default: // a token is already there
	}
	return true
}

// close stops the sender, waits for it and closes the connection, which
// also ends the reader.
func (l *link) close() {
	l.once.Do(func() {
		close(l.stop)
		l.conn.Close()
		<-l.done
	})
}
