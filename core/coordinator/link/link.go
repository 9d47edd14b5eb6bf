// Package link is the coordinator's transport to its ranks: the control
// server that accepts connections and runs their handshakes (Server), the
// record of which ranks hold a connection (Slots), and each rank's Link, a
// queue of outgoing frames drained by one sender goroutine. It turns what
// arrives into Events on one channel and owns no run state.
//
// Neighbours: core/wire below (handshake, frames); above it
// core/coordinator's loop reads the Events, and its membership table
// (core/coordinator/membership) holds each rank's Link.
package link

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

// Kind says what an Event from a connection's goroutines reports.
type Kind int

const (
	Joined  Kind = iota // the handshake succeeded
	Message             // a frame arrived
	Down                // the connection failed or closed
)

// Event is what the connection goroutines tell the loop. Conn identifies
// the connection, so a late event of a replaced connection is ignored.
type Event struct {
	Kind Kind
	Rank uint32
	Conn *wire.Conn
	Msg  proto.Message
	Err  error
}

// String names the event for Options.LoopTimer: a frame by its message
// name.
func (ev Event) String() string {
	switch ev.Kind {
	case Joined:
		return "joined"
	case Down:
		return "link down"
	}
	if ev.Msg == nil {
		return "frame"
	}
	return string(ev.Msg.ProtoReflect().Descriptor().Name())
}

// Slots records which ranks hold a connection, for the handshake's
// duplicate check. The loop releases a slot when it drops a rank that may
// connect again (before the cohort is formed).
type Slots struct {
	mu    sync.Mutex
	world uint32
	taken map[uint32]bool
}

// NewSlots is the slots of a world of ranks, all free.
func NewSlots(world uint32) *Slots {
	return &Slots{world: world, taken: map[uint32]bool{}}
}

// reserve takes rank's slot or says why the hello is refused.
func (s *Slots) reserve(h wire.Hello) error {
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

// Release frees rank's slot: a new connection may take it.
func (s *Slots) Release(rank uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.taken, rank)
}

// Server accepts rank connections, runs their handshakes and reads their
// frames; every goroutine it starts is tracked by WG.
type Server struct {
	Listener net.Listener
	Keys     wire.Keys
	Slots    *Slots
	Options  []wire.Option
	Events   chan<- Event
	Logger   hclog.Logger
	WG       *sync.WaitGroup
}

// Serve accepts until the listener is closed. Each connection gets its own
// goroutine, so a slow or hostile peer cannot hold up the others.
func (s *Server) Serve(ctx context.Context) {
	for {
		nc, err := s.Listener.Accept()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.Logger.Error("control server stopped accepting", "error", err)
			}
			return
		}
		s.WG.Add(1)
		go func() {
			defer s.WG.Done()
			s.handle(ctx, nc)
		}()
	}
}

// handle runs one connection: the handshake, then its reader until the
// connection fails or ctx ends.
func (s *Server) handle(ctx context.Context, nc net.Conn) {
	reserved := false
	var hello wire.Hello
	accept := func(h wire.Hello) error {
		if err := s.Slots.reserve(h); err != nil {
			return err
		}
		reserved, hello = true, h
		return nil
	}
	conn, _, err := wire.ServerHandshake(ctx, nc, s.Keys, accept, s.Options...)
	if err != nil {
		if reserved {
			// The hello was accepted but the ack could not be sent: the slot
			// is free again.
			s.Slots.Release(hello.Rank)
		}
		if ctx.Err() == nil {
			s.Logger.Warn("refused a rank connection", "remote", nc.RemoteAddr().String(), "reason", err.Error())
		}
		return
	}
	rank := hello.Rank
	// The reader ends only when the connection is of no further use (it
	// failed, fell silent, or the run is over), so closing it here is what
	// guarantees its writer goroutine ends, even for a connection the loop
	// never took.
	defer conn.Close()
	if !s.emit(ctx, Event{Kind: Joined, Rank: rank, Conn: conn}) {
		return
	}
	for {
		msg, err := conn.Receive(ctx)
		if err != nil {
			s.emit(ctx, Event{Kind: Down, Rank: rank, Conn: conn, Err: err})
			return
		}
		if !s.emit(ctx, Event{Kind: Message, Rank: rank, Conn: conn, Msg: msg}) {
			return
		}
	}
}

func (s *Server) emit(ctx context.Context, ev Event) bool {
	select {
	case s.Events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// OutboxSize bounds the frames queued for one rank. A rank that lets this
// many pile up is not reading; it is dropped rather than grow memory.
const OutboxSize = 4096

// Link is the loop's handle on one rank connection: a queue drained by one
// sender goroutine, so the loop never blocks on a slow peer and frames
// reach the rank in the order the loop queued them. The queue is a slice
// that grows with what is queued, not a channel of OutboxSize slots: a
// thousand ranks' outboxes would hold 64 MB that a reading rank never
// uses.
type Link struct {
	rank uint32
	conn *wire.Conn

	mu   sync.Mutex
	out  []proto.Message
	wake chan struct{} // holds a token while out may be non-empty
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// New is the link of rank over conn; Run must follow to send what is
// queued.
func New(rank uint32, conn *wire.Conn) *Link {
	return &Link{
		rank: rank,
		conn: conn,
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// Conn is the link's connection.
func (l *Link) Conn() *wire.Conn { return l.conn }

// Run sends queued frames until stopped; a failed send is reported on
// events as the link going down.
func (l *Link) Run(ctx context.Context, events chan<- Event) {
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
				case events <- Event{Kind: Down, Rank: l.rank, Conn: l.conn, Err: fmt.Errorf("send: %w", err)}:
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

// Queue hands msg to the sender without blocking; false means the queue
// is full.
func (l *Link) Queue(msg proto.Message) bool {
	l.mu.Lock()
	n := len(l.out)
	if n < OutboxSize {
		l.out = append(l.out, msg)
	}
	l.mu.Unlock()
	if n >= OutboxSize {
		return false
	}
	select {
	case l.wake <- struct{}{}:
	default: // a token is already there
	}
	return true
}

// Close stops the sender, waits for it and closes the connection, which
// also ends the reader.
func (l *Link) Close() {
	l.once.Do(func() {
		close(l.stop)
		l.conn.Close()
		<-l.done
	})
}
