package wire

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
)

// tap records every byte read through a connection, as a wiretap on the
// rank's side of the link would.
type tap struct {
	net.Conn
	mu  sync.Mutex
	got []byte
}

func (t *tap) Read(b []byte) (int, error) {
	n, err := t.Conn.Read(b)
	t.mu.Lock()
	t.got = append(t.got, b[:n]...)
	t.mu.Unlock()
	return n, err
}

func (t *tap) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.got...)
}

// recordSession runs a real rank against a real coordinator and returns
// what the rank sent (its hello, then its frames) and the ack it got.
func recordSession(t *testing.T, keys Keys, hello Hello, msgs ...*wirepb.Heartbeat) (sent, ack []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cn, sn := rawPair(t, "tcp")
	up := &tap{Conn: sn}
	down := &tap{Conn: cn}
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, _, err := ServerHandshake(ctx, up, keys, nil)
		ch <- res{c, err}
	}()
	rank, err := ClientHandshake(ctx, down, keys, hello)
	if err != nil {
		t.Fatalf("ClientHandshake: %v", err)
	}
	defer rank.Close()
	r := <-ch
	if r.err != nil {
		t.Fatalf("ServerHandshake: %v", r.err)
	}
	defer r.c.Close()
	for _, m := range msgs {
		if err := rank.Send(ctx, m); err != nil {
			t.Fatalf("send: %v", err)
		}
		if _, err := r.c.Receive(ctx); err != nil {
			t.Fatalf("the recorded session's own coordinator refused a frame: %v", err)
		}
	}
	return up.bytes(), down.bytes()
}

// A session recorded off the wire, replayed byte for byte at a coordinator
// holding the same secret (a later run's, or the same one again), gets a
// new ack, and none of its frames verify: the coordinator's fresh nonce
// gives the replayed connection keys the recording never used.
func TestRecordedSessionDoesNotReplay(t *testing.T) {
	hello := Hello{Rank: 1, World: 2}
	runKeys := mustKeys(t, testSecret)
	sent, ack := recordSession(t, runKeys, hello, &wirepb.Heartbeat{Rank: 1, Counter: 1}, &wirepb.Heartbeat{Rank: 1, Counter: 2})
	if len(sent) <= helloSize || len(ack) != ackSize {
		t.Fatalf("recorded %d bytes up and %d down; want a hello and frames up, an ack down", len(sent), len(ack))
	}
	cases := []struct {
		name string
		keys Keys
	}{
		{name: "a later run with the same secret", keys: mustKeys(t, testSecret)},
		{name: "the same run, again", keys: runKeys},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			cn, sn := rawPair(t, "tcp")
			type res struct {
				c   *Conn
				err error
			}
			ch := make(chan res, 1)
			go func() {
				c, _, err := ServerHandshake(ctx, sn, tc.keys, nil)
				ch <- res{c, err}
			}()
			if _, err := cn.Write(sent); err != nil {
				t.Fatalf("replay: %v", err)
			}
			r := <-ch
			if r.err != nil {
				// Refusing the replayed hello outright is as good.
				if !errors.Is(r.err, authframe.ErrRefused) && !errors.Is(r.err, authframe.ErrBadTag) {
					t.Fatalf("ServerHandshake: %v", r.err)
				}
				return
			}
			defer r.c.Close()
			got := make([]byte, ackSize)
			if _, err := readFullTimeout(cn, got); err != nil {
				t.Fatalf("read ack: %v", err)
			}
			if bytes.Equal(got, ack) {
				t.Errorf("the coordinator answered the replayed hello with the recorded ack % x", got)
			}
			if m, err := r.c.Receive(ctx); !errors.Is(err, authframe.ErrBadTag) {
				t.Fatalf("replayed frame: got %v, %v; want an error wrapping %v", m, err, authframe.ErrBadTag)
			}
		})
	}
}
