// Package link is a rank's end of its control connection to the
// coordinator: dialling with retries and the handshake, the wait for
// Admit, every frame the rank sends (Send), the one goroutine that reads
// (Read, which sorts what arrives for a Handler), the heartbeat, and the
// relay and meeting-point requests an averager makes through the
// coordinator (Relay).
//
// Files: link.go (Dial, AwaitAdmit, Send, Heartbeat), read.go (Read and
// its Handler, the link's failures), relay.go (Relay).
//
// Neighbours: core/wire carries the frames (core/wire/wirepb) and writes
// the socket from its own goroutine; core/worker, the link's one user,
// handles what Read hands it; the other end is core/coordinator's link.
// docs/protocol.md is the conversation.
package link

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/mtls"
)

// Dial retries back off from dialRetryMin to dialRetryMax, each pause
// jittered by up to a quarter, so a cohort of ranks started together does
// not knock on the coordinator in lockstep.
const (
	dialRetryMin = 250 * time.Millisecond
	dialRetryMax = 5 * time.Second
)

// retryPause is the pause after failed attempt n (from 1); rnd is in [0,1).
func retryPause(n int, rnd float64) time.Duration {
	d := dialRetryMin
	for i := 1; i < n && d < dialRetryMax; i++ {
		d *= 2
	}
	d = min(d, dialRetryMax)
	return d - time.Duration(rnd*float64(d)/4)
}

// Config is how a rank reaches its coordinator.
type Config struct {
	// Coordinator is the control server's address, host:port.
	Coordinator string
	Rank, World uint32
	Keys        wire.Keys
	// TLS, when enabled, runs the connection in mutual TLS.
	TLS mtls.Files
	// LivenessTimeout is the coordinator silence that ends Read.
	LivenessTimeout time.Duration
	// ConnectTimeout is how long dialling is retried.
	ConnectTimeout time.Duration
	// RetryMax, when set, caps the pause between attempts below
	// dialRetryMax: a rank waiting for its coordinator to come back
	// retries often.
	RetryMax time.Duration
	// Stopping ends every relay and meeting wait when the rank stops.
	Stopping <-chan struct{}
	Logger   hclog.Logger
}

// Link is one connected control link.
type Link struct {
	c     Config
	log   hclog.Logger
	conn  *wire.Conn
	relay *Relay
}

// Dial dials the coordinator, retrying until ConnectTimeout, and runs the
// handshake. Only dialing is retried: a coordinator that refuses the hello
// (wrong secret, world size or rank) will refuse it again. While it waits
// the rank says, once and then every ten seconds, whom it waits for.
func Dial(ctx context.Context, c Config) (*Link, error) {
	// A silent coordinator ends Receive after the liveness timeout, which
	// Read takes for a dead coordinator.
	opts := []wire.Option{wire.WithIdleTimeout(c.LivenessTimeout)}
	if c.TLS.Enabled() {
		cfg, err := c.TLS.ClientConfigFor(c.Coordinator)
		if err != nil {
			return nil, fmt.Errorf("connect to coordinator %s: worker.tls: %w", c.Coordinator, err)
		}
		opts = append(opts, wire.WithTLS(cfg))
	}
	dctx, cancel := context.WithTimeout(ctx, c.ConnectTimeout)
	defer cancel()
	var d net.Dialer
	var nc net.Conn
	start := time.Now()
	var lastSaid time.Time
	// lastErr is the last attempt's own failure: one that the deadline cut
	// short says only that time ran out (a name lookup's "i/o timeout"),
	// which would hide why every attempt before it failed.
	var lastErr error
	giveUp := func(attempts int) error {
		return fmt.Errorf("connect to coordinator %s: gave up after %v and %s (worker.connect_timeout); the last attempt: %w",
			c.Coordinator, c.ConnectTimeout, plural(attempts, "attempt"), lastErr)
	}
	for attempt := 1; ; attempt++ {
		var err error
		nc, err = d.DialContext(dctx, "tcp", c.Coordinator)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to coordinator %s: %w", c.Coordinator, ctx.Err())
		}
		if dctx.Err() == nil || lastErr == nil {
			lastErr = err
		}
		if dctx.Err() != nil {
			return nil, giveUp(attempt)
		}
		pause := retryPause(attempt, rand.Float64())
		if c.RetryMax > 0 {
			pause = min(pause, c.RetryMax)
		}
		if time.Since(lastSaid) >= 10*time.Second {
			lastSaid = time.Now()
			c.Logger.Info("waiting for the coordinator", "address", c.Coordinator, "attempt", attempt,
				"waited", time.Since(start).Round(time.Millisecond), "gives_up_after", c.ConnectTimeout, "error", err)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-dctx.Done():
			t.Stop()
			if ctx.Err() == nil {
				return nil, giveUp(attempt)
			}
		}
	}
	conn, err := wire.ClientHandshake(ctx, nc, c.Keys, wire.Hello{Rank: c.Rank, World: c.World}, opts...)
	if err != nil {
		return nil, fmt.Errorf("handshake with coordinator %s: %w", c.Coordinator, err)
	}
	return &Link{c: c, log: c.Logger, conn: conn, relay: newRelay(conn, c.Stopping)}, nil
}

// ErrShutdownBeforeAdmit: the coordinator sent Shutdown instead of Admit.
var ErrShutdownBeforeAdmit = errors.New("coordinator sent Shutdown before Admit")

// AwaitAdmit reads frames until Admit. Coordinator heartbeats are skipped;
// a Shutdown ends the rank cleanly (ErrShutdownBeforeAdmit); anything else
// is out of protocol. It runs before Read starts.
func (l *Link) AwaitAdmit(ctx context.Context) (*wirepb.Admit, error) {
	for {
		msg, err := l.conn.Receive(ctx)
		if err != nil {
			return nil, fmt.Errorf("wait for Admit from coordinator: %w", err)
		}
		switch m := msg.(type) {
		case *wirepb.Admit:
			return m, nil
		case *wirepb.CoordinatorHeartbeat:
		case *wirepb.Shutdown:
			return nil, ErrShutdownBeforeAdmit
		default:
			return nil, fmt.Errorf("wait for Admit from coordinator: got %T first", msg)
		}
	}
}

// Relay is the rank's side of the coordinator's relay, for the averager.
func (l *Link) Relay() *Relay { return l.relay }

// Send writes one frame, naming it in the error. Any goroutine may send.
func (l *Link) Send(ctx context.Context, msg proto.Message) error {
	if err := l.conn.Send(ctx, msg); err != nil {
		return fmt.Errorf("send %s: %w", msg.ProtoReflect().Descriptor().Name(), err)
	}
	return nil
}

// KeepRelay moves r, the relay of this rank's lost link, which its
// averager holds, onto this link.
func (l *Link) KeepRelay(r *Relay) {
	r.rebind(l.conn)
	l.relay = r
}

// Close closes the connection.
func (l *Link) Close() error { return l.conn.Close() }

// Heartbeat sends Heartbeat every interval until ctx ends, from a
// goroutine of its own, so a rank blocked in a round is not taken for
// dead.
func (l *Link) Heartbeat(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var counter uint64
	for {
		counter++
		if err := l.conn.Send(ctx, &wirepb.Heartbeat{Rank: l.c.Rank, Counter: counter}); err != nil && ctx.Err() == nil {
			l.log.Debug("send Heartbeat", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// plural is n and noun, plural unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
