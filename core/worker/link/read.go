package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Why a link fails; the cause Handler.Lost gets wraps one of them.
var (
	// ErrLinkLost: the control connection broke before a clean Shutdown.
	ErrLinkLost = errors.New("coordinator link lost")
	// ErrCoordinatorSilent: no frame arrived within the liveness timeout.
	ErrCoordinatorSilent = errors.New("coordinator silent past the liveness timeout")
)

// Handler takes what Read does not answer itself. Every call comes from
// Read's goroutine and must not block for long: while it runs nothing is
// read, and the liveness clock runs on.
type Handler interface {
	// PeerDead: the coordinator declared rank dead (DeclareDead).
	PeerDead(rank uint32, reason string)
	// NewSession: the coordinator formed a new averaging session.
	NewSession(s plugin.Session)
	// SessionIDRequested: the coordinator asks for a session id for
	// generation gen (RequestSessionId); the answer is the handler's.
	SessionIDRequested(ctx context.Context, gen uint64)
	// Command is any other frame: the rank's main loop's to handle.
	Command(msg proto.Message)
	// Lost: the link failed before a clean Shutdown; cause wraps
	// ErrLinkLost or ErrCoordinatorSilent. Read returns after it.
	Lost(cause error)
}

// Read is the one goroutine that reads the connection, until ctx ends or
// the link fails. Any frame proves the coordinator alive (Receive's idle
// timeout is the liveness clock). Membership frames go to h at once,
// because the rank's main loop may be blocked in a round that only they
// can end; relay results and meeting points go to the Relay.
func (l *Link) Read(ctx context.Context, h Handler) {
	clean := false // a Shutdown arrived: the EOF that follows is expected
	for {
		msg, err := l.conn.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return // teardown
			}
			if clean {
				l.log.Debug("control link closed after Shutdown", "reason", err)
				return
			}
			var cause error
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				cause = fmt.Errorf("%w (%v): %w", ErrCoordinatorSilent, l.c.LivenessTimeout, err)
			case errors.Is(err, io.EOF):
				cause = fmt.Errorf("%w: the coordinator closed the connection before Shutdown", ErrLinkLost)
			default:
				cause = fmt.Errorf("%w: %w", ErrLinkLost, err)
			}
			h.Lost(cause)
			return
		}
		switch m := msg.(type) {
		case *wirepb.CoordinatorHeartbeat:
			// Only proof of life, which Receive already counted.
		case *wirepb.DeclareDead:
			h.PeerDead(m.GetRank(), m.GetReason())
		case *wirepb.NewSession:
			h.NewSession(plugin.Session{
				Generation:   m.GetGeneration(),
				ID:           m.GetSessionId(),
				NewRank:      m.GetNewRank(),
				NewWorldSize: m.GetNewWorldSize(),
				Members:      m.GetMembers(),
			})
		case *wirepb.RequestSessionId:
			h.SessionIDRequested(ctx, m.GetGeneration())
		case *wirepb.Meeting:
			l.relay.deliverMeeting(m)
		case *wirepb.RelayResult:
			if !l.relay.deliver(m) {
				l.log.Debug("relay result nobody waits for", "key", m.GetKey())
			}
		case *wirepb.Admit:
			l.log.Warn("ignoring a second Admit")
		case *wirepb.Shutdown, *wirepb.ShutdownWithSave:
			clean = true
			h.Command(msg)
		default:
			h.Command(msg)
		}
	}
}
