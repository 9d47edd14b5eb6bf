package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
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

// connect dials the coordinator, retrying until ConnectTimeout, and runs the
// handshake. Only dialing is retried: a coordinator that refuses the hello
// (wrong secret, world size or rank) will refuse it again. While it waits
// the worker says, once and then every ten seconds, whom it waits for.
func (w *worker) connect(ctx context.Context) (*wire.Conn, error) {
	// A silent coordinator ends Receive after the liveness timeout, which
	// the inbound bridge reads as a dead coordinator.
	opts := []wire.Option{wire.WithIdleTimeout(w.o.LivenessTimeout)}
	if w.o.TLS.Enabled() {
		cfg, err := w.o.TLS.ClientConfigFor(w.o.Coordinator)
		if err != nil {
			return nil, fmt.Errorf("connect to coordinator %s: worker.tls: %w", w.o.Coordinator, err)
		}
		opts = append(opts, wire.WithTLS(cfg))
	}
	dctx, cancel := context.WithTimeout(ctx, w.o.ConnectTimeout)
	defer cancel()
	var d net.Dialer
	var nc net.Conn
	start := time.Now()
	var lastSaid time.Time
	for attempt := 1; ; attempt++ {
		var err error
		nc, err = d.DialContext(dctx, "tcp", w.o.Coordinator)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to coordinator %s: %w", w.o.Coordinator, ctx.Err())
		}
		if dctx.Err() != nil {
			return nil, fmt.Errorf("connect to coordinator %s: gave up after %v and %d attempts (worker.connect_timeout): %w",
				w.o.Coordinator, w.o.ConnectTimeout, attempt, err)
		}
		pause := retryPause(attempt, rand.Float64())
		if time.Since(lastSaid) >= 10*time.Second {
			lastSaid = time.Now()
			w.log.Info("waiting for the coordinator", "address", w.o.Coordinator, "attempt", attempt,
				"waited", time.Since(start).Round(time.Millisecond), "gives_up_after", w.o.ConnectTimeout, "error", err)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-dctx.Done():
			t.Stop()
		}
	}
	conn, err := wire.ClientHandshake(ctx, nc, w.keys, wire.Hello{Rank: w.o.Rank, World: w.o.World}, opts...)
	if err != nil {
		return nil, fmt.Errorf("handshake with coordinator %s: %w", w.o.Coordinator, err)
	}
	return conn, nil
}

// errShutdownBeforeAdmit: the coordinator sent Shutdown instead of Admit.
var errShutdownBeforeAdmit = errors.New("coordinator sent Shutdown before Admit")

// awaitAdmit reads frames until Admit. Coordinator heartbeats are skipped;
// a Shutdown ends the worker cleanly; anything else is out of protocol.
func (w *worker) awaitAdmit(ctx context.Context) (*wirepb.Admit, error) {
	for {
		msg, err := w.conn.Receive(ctx)
		if err != nil {
			return nil, fmt.Errorf("wait for Admit from coordinator: %w", err)
		}
		switch m := msg.(type) {
		case *wirepb.Admit:
			return m, nil
		case *wirepb.CoordinatorHeartbeat:
		case *wirepb.Shutdown:
			return nil, errShutdownBeforeAdmit
		default:
			return nil, fmt.Errorf("wait for Admit from coordinator: got %T first", msg)
		}
	}
}
