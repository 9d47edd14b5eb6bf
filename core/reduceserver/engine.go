package reduceserver

// The engine: one goroutine owns all membership and round state and
// handles every event (a rank connected, a frame, a rank lost or declared
// dead) in turn, so none of that state needs a lock. This file is the loop
// and its frame dispatch; membership.go and barrier.go are its handlers.

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/reduce"
)

type evKind int

const (
	evConnected evKind = iota
	evFrame
	evLost
	evDead
)

type event struct {
	kind  evKind
	rc    *rankConn
	frame reduce.Frame
	err   error
	rank  uint32
}

type member struct {
	rc   *rankConn
	join *reduce.Join
	// ring is where the rank listens for ring links: the address it
	// connected from, at the port it joined with.
	ring string
}

// engine owns the membership and the rounds; only its goroutine touches
// them.
type engine struct {
	s       *Server
	log     hclog.Logger
	members map[uint32]*member
	gone    map[uint32]bool
	// ending is set by the first goodbye: ranks say it only as they shut
	// down, and a rank's channel that breaks after it is one leaving with
	// the rest (its goodbye lost when this side's send to it failed and
	// closed the socket first), not news.
	ending  bool
	formed  bool
	topoGen uint64
	hosts   [][]uint32

	announces  map[uint32]reduce.Announce
	cur        *round
	failedUpTo uint64
	failReason string
	anyFailed  bool
	doneUpTo   uint64
	anyDone    bool
	sessionGen uint64
}

// whyLost is the reason of a rank whose data channel broke.
const whyLost = "lost its data channel"

func newEngine(s *Server) *engine {
	return &engine{
		s: s, log: s.log, members: map[uint32]*member{}, gone: map[uint32]bool{},
		announces: map[uint32]reduce.Announce{},
	}
}

func (e *engine) run() {
	defer func() {
		for _, m := range e.members {
			m.rc.conn.Close()
		}
	}()
	for {
		select {
		case ev := <-e.s.events:
			e.handle(ev)
		case <-e.s.ctx.Done():
			// Drain connections that were admitted meanwhile.
			for {
				select {
				case ev := <-e.s.events:
					if ev.kind == evConnected {
						ev.rc.conn.Close()
						e.s.connected.Add(-1)
					}
				default:
					return
				}
			}
		}
	}
}

func (e *engine) handle(ev event) {
	switch ev.kind {
	case evConnected:
		r := ev.rc.rank
		if e.gone[r] {
			ev.rc.conn.Close()
			e.s.connected.Add(-1)
			return
		}
		e.members[r] = &member{rc: ev.rc}
	case evDead:
		e.remove(ev.rank, "was declared dead", nil, false, false)
	case evLost:
		if m := e.members[ev.who()]; m != nil && m.rc == ev.rc && errors.Is(ev.err, reduce.ErrByeCut) {
			e.remove(ev.rc.rank, "said goodbye as its connection closed", errBye, false, false)
		} else if m != nil && m.rc == ev.rc {
			why, refused := whyLost, false
			for _, bad := range []error{authframe.ErrBadTag, authframe.ErrTooLarge, authframe.ErrBadMagic, authframe.ErrUnknownKind, authframe.ErrMalformed} {
				if errors.Is(ev.err, bad) {
					why, refused = "sent a frame that was refused", true
				}
			}
			// A formed cohort's rank whose link merely broke (a frame cut
			// short included: its process died mid-send) may dial again;
			// one that sent what no honest rank sends may not.
			e.remove(ev.rc.rank, why, ev.err, true, e.formed && !refused)
		}
	case evFrame:
		m := e.members[ev.rc.rank]
		if m == nil || m.rc != ev.rc {
			return
		}
		if err := e.frame(m, ev.frame); err != nil {
			e.remove(ev.rc.rank, "broke the protocol", err, true, false)
		}
	}
}

func (ev event) who() uint32 {
	if ev.rc != nil {
		return ev.rc.rank
	}
	return ev.rank
}

var errBye = errors.New("goodbye")

func (e *engine) send(m *member, kind reduce.Kind, payload ...[]byte) {
	if m == nil {
		return
	}
	if _, err := m.rc.conn.SendAsync(kind, payload...); err != nil {
		e.log.Debug("send failed", "rank", m.rc.rank, "kind", kind.String(), "error", err.Error())
	}
}

func (e *engine) frame(m *member, f reduce.Frame) error {
	if m.join == nil && f.Kind != reduce.KindJoin {
		return fmt.Errorf("%v frame before join", f.Kind)
	}
	// A case a kind: decode, then hand to its handler (so the cases read
	// alike).
	switch f.Kind {
	case reduce.KindJoin:
		if m.join != nil {
			return errors.New("second join")
		}
		j, err := reduce.DecodeJoin(f.Payload)
		if err != nil {
			return err
		}
		m.join = &j
		host, _, err := net.SplitHostPort(m.rc.conn.RemoteAddr().String())
		if err != nil {
			return fmt.Errorf("rank's address %v: %w", m.rc.conn.RemoteAddr(), err)
		}
		m.ring = net.JoinHostPort(host, strconv.Itoa(int(j.RingPort)))
		e.log.Debug("rank joined", "rank", m.rc.rank, "arena", j.ArenaPath, "pid", j.PID)
		e.membershipChanged()
		return nil
	case reduce.KindAnnounce:
		a, err := reduce.DecodeAnnounce(f.Payload)
		if err != nil {
			return err
		}
		return e.announce(m, a)
	case reduce.KindAbort:
		a, err := reduce.DecodeAbort(f.Payload)
		if err != nil {
			return err
		}
		e.abort(m.rc.rank, a)
		return nil
	case reduce.KindSession:
		s, err := reduce.DecodeSession(f.Payload)
		if err != nil {
			return err
		}
		e.session(m.rc.rank, s)
		return nil
	case reduce.KindBye:
		if err := reduce.DecodeEmpty(f.Kind, f.Payload); err != nil {
			return err
		}
		e.remove(m.rc.rank, "said goodbye", errBye, false, false)
		return nil
	case reduce.KindFolded, reduce.KindReceived:
		r, err := reduce.DecodeRoundRef(f.Kind, f.Payload)
		if err != nil {
			return err
		}
		if f.Kind == reduce.KindFolded {
			return e.folded(m, r.Round)
		}
		return e.received(m, r.Round)
	case reduce.KindDone:
		d, err := reduce.DecodeDone(f.Payload)
		if err != nil {
			return err
		}
		return e.done(m, d)
	}
	return fmt.Errorf("unexpected %v frame", f.Kind)
}
