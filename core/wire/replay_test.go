package wire

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
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
// what the rank sent (its hello, proof, then its frames) and what it got
// (the challenge and the ack).
func recordSession(t *testing.T, keys Keys, hello Hello, msgs ...*wirepb.Heartbeat) (sent, got []byte) {
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
// holding the same secret (a later run's, or the same one again), is never
// acknowledged and never consulted about a slot: the coordinator's fresh
// challenge makes the recorded proof fail, whether the replayer sends the
// whole recording at once or waits for the challenge first.
func TestRecordedSessionDoesNotReplay(t *testing.T) {
	hello := Hello{Rank: 1, World: 2}
	runKeys := mustKeys(t, testSecret)
	sent, got := recordSession(t, runKeys, hello, &wirepb.Heartbeat{Rank: 1, Counter: 1}, &wirepb.Heartbeat{Rank: 1, Counter: 2})
	if len(sent) <= helloSize+sealSize || len(got) != challengeSize+sealSize {
		t.Fatalf("recorded %d bytes up and %d down; want a hello, a proof and frames up, a challenge and an ack down", len(sent), len(got))
	}
	cases := []struct {
		name    string
		keys    Keys
		stepped bool // wait for the challenge before sending the rest
	}{
		{name: "a later run with the same secret", keys: mustKeys(t, testSecret)},
		{name: "the same run, again", keys: runKeys},
		{name: "the same run, waiting for the challenge", keys: runKeys, stepped: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			cn, sn := rawPair(t, "tcp")
			type res struct {
				c        *Conn
				err      error
				accepted bool
			}
			ch := make(chan res, 1)
			go func() {
				accepted := false
				c, _, err := ServerHandshake(ctx, sn, tc.keys, func(Hello) error { accepted = true; return nil })
				ch <- res{c, err, accepted}
			}()
			first := sent
			if tc.stepped {
				first = sent[:helloSize]
			}
			if _, err := cn.Write(first); err != nil {
				t.Fatalf("replay: %v", err)
			}
			challenge := make([]byte, challengeSize)
			if _, err := readFullTimeout(cn, challenge); err != nil {
				t.Fatalf("read challenge: %v", err)
			}
			if bytes.Equal(challenge, got[:challengeSize]) {
				t.Fatalf("the coordinator challenged the replayed hello with the recorded challenge % x", challenge)
			}
			if tc.stepped {
				if _, err := cn.Write(sent[helloSize:]); err != nil {
					t.Fatalf("replay: %v", err)
				}
			}
			r := <-ch
			if r.c != nil {
				r.c.Close()
				t.Fatal("the coordinator completed a handshake with a replayed session")
			}
			if !errors.Is(r.err, authframe.ErrBadTag) {
				t.Fatalf("ServerHandshake: %v; want an error wrapping %v (the recorded proof)", r.err, authframe.ErrBadTag)
			}
			if r.accepted {
				t.Error("the coordinator consulted its membership for a replayed hello")
			}
			cn.SetReadDeadline(time.Now().Add(2 * time.Second))
			// The coordinator closed with the replayed frames unread, which
			// the replayer may see as a reset.
			if rest, err := io.ReadAll(cn); len(rest) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
				t.Errorf("after the replayed proof the replayer read % x, %v; want nothing, then the connection closed", rest, err)
			}
		})
	}
}
