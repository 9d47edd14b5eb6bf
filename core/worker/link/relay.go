package link

import (
	"context"
	"fmt"
	"sync"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Relay is this rank's side of the coordinator's relay (plugin.Relay,
// handed to the averager) and of its meeting-point request (Meet).
// Requests go out on the control link; Read delivers the answers here.
type Relay struct {
	// stopped ends every wait when the worker stops.
	stopped <-chan struct{}

	mu sync.Mutex
	// conn is the link's connection: a rank that takes a coordinator back
	// keeps its Relay (its averager holds it) on the new connection.
	conn    *wire.Conn
	waiting map[string]chan *wirepb.RelayResult
	meeting chan *wirepb.Meeting
}

func newRelay(conn *wire.Conn, stopped <-chan struct{}) *Relay {
	return &Relay{conn: conn, stopped: stopped, waiting: map[string]chan *wirepb.RelayResult{}, meeting: make(chan *wirepb.Meeting, 1)}
}

var _ plugin.Relay = (*Relay)(nil)

// Exchange posts blob under key and waits for the coordinator's result.
func (r *Relay) Exchange(ctx context.Context, key string, blob []byte) (map[uint32][]byte, error) {
	if len(blob) > plugin.MaxRelayBlob {
		return nil, fmt.Errorf("relay key %q: blob of %d bytes, limit %d", key, len(blob), plugin.MaxRelayBlob)
	}
	ch := make(chan *wirepb.RelayResult, 1)
	r.mu.Lock()
	if _, dup := r.waiting[key]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("relay key %q: this rank already waits on it", key)
	}
	r.waiting[key] = ch
	conn := r.conn
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.waiting, key)
		r.mu.Unlock()
	}()

	if err := conn.Send(ctx, &wirepb.RelayPost{Key: key, Blob: blob}); err != nil {
		return nil, fmt.Errorf("relay key %q: post: %w", key, err)
	}
	var m *wirepb.RelayResult
	select {
	case m = <-ch:
	case <-ctx.Done():
		return nil, fmt.Errorf("relay key %q: %w", key, ctx.Err())
	case <-r.stopped:
		return nil, fmt.Errorf("relay key %q: %w: the rank is stopping", key, plugin.ErrRoundAborted)
	}
	if m.GetError() != "" {
		return nil, fmt.Errorf("relay key %q: %w: %s", key, plugin.ErrRoundAborted, m.GetError())
	}
	out := make(map[uint32][]byte, len(m.GetBlobs()))
	for _, b := range m.GetBlobs() {
		if _, dup := out[b.GetRank()]; dup {
			return nil, fmt.Errorf("relay key %q: the coordinator sent rank %d's blob twice", key, b.GetRank())
		}
		out[b.GetRank()] = b.GetBlob()
	}
	return out, nil
}

// deliver hands a result to the exchange waiting on its key; a result
// nobody waits for (its wait was abandoned) is dropped.
func (r *Relay) deliver(m *wirepb.RelayResult) bool {
	r.mu.Lock()
	ch, ok := r.waiting[m.GetKey()]
	r.mu.Unlock()
	if ok {
		select {
		case ch <- m:
		default:
		}
	}
	return ok
}

// rebind moves the relay onto conn, a new connection to a coordinator that
// came back; an exchange still waiting on the old one fails at once.
func (r *Relay) rebind(conn *wire.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conn = conn
	for key, ch := range r.waiting {
		select {
		case ch <- &wirepb.RelayResult{Key: key, Error: "the coordinator was lost"}:
		default:
		}
	}
	select {
	case <-r.meeting:
	default:
	}
}

// deliverMeeting hands the coordinator's Meeting to Meet.
func (r *Relay) deliverMeeting(m *wirepb.Meeting) {
	select {
	case r.meeting <- m:
	default:
	}
}

// Meet asks the coordinator for the meeting point of kind and returns its
// endpoint as the coordinator gave it.
func (r *Relay) Meet(ctx context.Context, kind, averager string) (string, error) {
	r.mu.Lock()
	conn := r.conn
	r.mu.Unlock()
	if err := conn.Send(ctx, &wirepb.MeetRequest{Kind: kind, Averager: averager}); err != nil {
		return "", fmt.Errorf("ask for a %q meeting point: %w", kind, err)
	}
	select {
	case m := <-r.meeting:
		if m.GetError() != "" {
			return "", fmt.Errorf("the coordinator serves no meeting point for averager %q (meeting kind %q): %s", averager, kind, m.GetError())
		}
		if m.GetKind() != kind {
			return "", fmt.Errorf("asked for a %q meeting point, the coordinator answered for %q", kind, m.GetKind())
		}
		return m.GetEndpoint(), nil
	case <-ctx.Done():
		return "", fmt.Errorf("wait for a %q meeting point: %w", kind, context.Cause(ctx))
	}
}
