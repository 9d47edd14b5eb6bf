package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"google.golang.org/protobuf/proto"
)

// Every message kind crosses a real Conn pair intact, each in its own
// direction; after the peer closes, Receive reports a clean io.EOF.
func TestConnRoundTripEveryKind(t *testing.T) {
	for _, network := range []string{"pipe", "tcp"} {
		t.Run(network, func(t *testing.T) {
			rank, coord := connPair(t, network, Hello{Rank: 1, World: 3})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var toRankMsgs, toCoordMsgs []proto.Message
			for _, m := range sampleMessages() {
				if toRank(kindOf(m)) {
					toRankMsgs = append(toRankMsgs, m)
				} else {
					toCoordMsgs = append(toCoordMsgs, m)
				}
			}
			errs := make(chan error, 2)
			send := func(c *Conn, msgs []proto.Message) {
				for _, m := range msgs {
					if err := c.Send(ctx, m); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}
			go send(coord, toRankMsgs)
			go send(rank, toCoordMsgs)
			recv := func(c *Conn, want []proto.Message) {
				for _, w := range want {
					got, err := c.Receive(ctx)
					if err != nil {
						t.Fatalf("Receive %T: %v", w, err)
					}
					if !proto.Equal(got, w) {
						t.Fatalf("got %T %v, want %T %v", got, got, w, w)
					}
				}
			}
			recv(rank, toRankMsgs)
			recv(coord, toCoordMsgs)
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatalf("Send: %v", err)
				}
			}
			if err := coord.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if _, err := rank.Receive(ctx); err != io.EOF {
				t.Fatalf("Receive after the peer closed: %v, want io.EOF", err)
			}
		})
	}
}

// Many goroutines send through one Conn; every frame arrives whole and
// verified, each goroutine's frames in its order, none lost.
func TestConnConcurrentSend(t *testing.T) {
	const senders, each = 8, 200
	rank, coord := connPair(t, "tcp", Hello{Rank: 0, World: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				// A Metrics frame is large enough to span several TCP writes if
				// two writers ever interleaved.
				m := &wirepb.Metrics{Rank: uint32(g), Batches: uint64(i), Scalars: map[string]*wirepb.ScalarSum{
					"padding-padding-padding-padding": {Sum: float64(i), Count: uint64(g)},
				}}
				if i%2 == 1 {
					m.Resources = &wirepb.ResourceSample{Rank: uint32(g), Gpus: make([]*wirepb.GpuSample, 64)}
					for j := range m.Resources.Gpus {
						m.Resources.Gpus[j] = &wirepb.GpuSample{Index: uint32(j), Name: "gpu"}
					}
				}
				if err := rank.Send(ctx, m); err != nil {
					t.Errorf("sender %d frame %d: %v", g, i, err)
					return
				}
			}
		})
	}
	next := make([]uint64, senders)
	for n := 0; n < senders*each; n++ {
		msg, err := coord.Receive(ctx)
		if err != nil {
			t.Fatalf("after %d frames: %v", n, err)
		}
		m, ok := msg.(*wirepb.Metrics)
		if !ok || m.Rank >= senders {
			t.Fatalf("frame %d: unexpected %T %v", n, msg, msg)
		}
		if m.Batches != next[m.Rank] || m.Scalars["padding-padding-padding-padding"].GetCount() != uint64(m.Rank) {
			t.Fatalf("sender %d: got frame %d, want %d", m.Rank, m.Batches, next[m.Rank])
		}
		if m.Batches%2 == 1 && len(m.GetResources().GetGpus()) != 64 {
			t.Fatalf("sender %d frame %d lost its resources", m.Rank, m.Batches)
		}
		next[m.Rank]++
	}
	wg.Wait()
	for g, n := range next {
		if n != each {
			t.Errorf("sender %d: %d frames arrived, want %d", g, n, each)
		}
	}
}

// Bytes a real coordinator receives from a hand-driven rank: a good frame
// passes, a bad one fails, and the failure sticks (the stream is out of step).
func TestConnRejectsBadFrames(t *testing.T) {
	other := mustKeys(t, otherSecret)
	k := mustKeys(t, testSecret)
	helloOther := encodeHello(Hello{Rank: 0, World: 2}, testNonce(1), k.k.Handshake())
	challengeOther := encodeChallenge(helloOther[:], testNonce(2), k.k.Handshake())
	hb := func(n uint64) proto.Message { return &wirepb.Heartbeat{Rank: 1, Counter: n} }
	cases := []struct {
		name  string
		bytes func(w *frameWriter, first []byte) []byte // after one good frame
		want  error
	}{
		{"replayed frame", func(_ *frameWriter, first []byte) []byte {
			return first
		}, authframe.ErrBadTag},
		{"dropped frame", func(w *frameWriter, _ []byte) []byte {
			mustFrame(w, hb(1))
			return mustFrame(w, hb(2))
		}, authframe.ErrBadTag},
		{"wrong secret", func(w *frameWriter, _ []byte) []byte {
			hbytes := encodeHello(Hello{Rank: 1, World: 2}, testNonce(1), other.k.Handshake())
			abytes := encodeChallenge(hbytes[:], testNonce(2), other.k.Handshake())
			ow := writerAt(connKey(other, dirToCoord, hbytes[:], abytes[:challengeCore]), w.mac.Seq())
			return mustFrame(ow, hb(1))
		}, authframe.ErrBadTag},
		{"spliced from rank 0's connection", func(w *frameWriter, _ []byte) []byte {
			ow := writerAt(connKey(k, dirToCoord, helloOther[:], challengeOther[:challengeCore]), w.mac.Seq())
			return mustFrame(ow, hb(1))
		}, authframe.ErrBadTag},
		{"flipped payload bit", func(w *frameWriter, _ []byte) []byte {
			b := mustFrame(w, hb(1))
			b[len(b)-1] ^= 4
			return b
		}, authframe.ErrBadTag},
		{"wrong-direction kind", func(w *frameWriter, _ []byte) []byte {
			return mustFrame(w, &wirepb.Shutdown{})
		}, authframe.ErrUnknownKind},
		{"over the limit", func(w *frameWriter, _ []byte) []byte {
			return mustFrame(w, &wirepb.Ready{Trainer: string(make([]byte, 300))})
		}, authframe.ErrTooLarge},
		{"closed mid-frame", func(w *frameWriter, _ []byte) []byte {
			return mustFrame(w, hb(1))[:headerSize+2]
		}, authframe.ErrTruncated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, w, coord := fakeRank(t, Hello{Rank: 1, World: 2}, WithMaxPayload(256))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			go func() {
				first := mustFrame(w, hb(0))
				raw.Write(first)
				raw.Write(tc.bytes(w, first))
				raw.Close()
			}()
			if msg, err := coord.Receive(ctx); err != nil || !proto.Equal(msg, hb(0)) {
				t.Fatalf("good frame: %v, %v", msg, err)
			}
			_, err := coord.Receive(ctx)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if _, again := coord.Receive(ctx); !errors.Is(again, tc.want) {
				t.Fatalf("next Receive: %v, want the same failure", again)
			}
		})
	}
}

func mustFrame(w *frameWriter, m proto.Message) []byte {
	kind, payload, err := Encode(m)
	if err != nil {
		panic(err)
	}
	return w.appendFrame(nil, kind, payload)
}

// While no frame has begun, ctx and the idle timeout bound the wait and the
// connection stays usable; once a frame has begun, only the read timeout
// bounds it.
func TestReceiveWaits(t *testing.T) {
	const short = 60 * time.Millisecond
	t.Run("idle", func(t *testing.T) {
		raw, w, coord := fakeRank(t, Hello{Rank: 0, World: 1}, WithIdleTimeout(short))
		expired, cancel := context.WithTimeout(context.Background(), short)
		defer cancel()
		cancelled, cancel2 := context.WithCancel(context.Background())
		time.AfterFunc(short, cancel2)
		for _, tc := range []struct {
			name string
			ctx  context.Context
			want error
		}{
			{"ctx deadline", expired, context.DeadlineExceeded},
			{"ctx cancelled", cancelled, context.Canceled},
			{"idle timeout", context.Background(), os.ErrDeadlineExceeded},
		} {
			start := time.Now()
			_, err := coord.Receive(tc.ctx)
			if !errors.Is(err, tc.want) {
				t.Fatalf("%s: got %v, want %v", tc.name, err, tc.want)
			}
			if el := time.Since(start); el > 3*time.Second {
				t.Fatalf("%s: returned after %v", tc.name, el)
			}
		}
		// Still in step.
		want := &wirepb.Heartbeat{Rank: 0, Counter: 1}
		go raw.Write(mustFrame(w, want))
		ctx, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel3()
		if got, err := coord.Receive(ctx); err != nil || !proto.Equal(got, want) {
			t.Fatalf("after the timeouts: %v, %v", got, err)
		}
	})
	t.Run("committed", func(t *testing.T) {
		raw, w, coord := fakeRank(t, Hello{Rank: 0, World: 1}, WithReadTimeout(3*short))
		go raw.Write(mustFrame(w, &wirepb.Heartbeat{})[:10]) // and then nothing
		ctx, cancel := context.WithTimeout(context.Background(), short/2)
		defer cancel()
		start := time.Now()
		_, err := coord.Receive(ctx)
		el := time.Since(start)
		if !errors.Is(err, authframe.ErrTruncated) || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("got %v, want authframe.ErrTruncated after the read timeout", err)
		}
		if el < 3*short-10*time.Millisecond || el > 3*time.Second {
			t.Fatalf("gave up mid-frame after %v, want about %v (the read timeout, not ctx)", el, 3*short)
		}
		if _, again := coord.Receive(context.Background()); !errors.Is(again, authframe.ErrTruncated) {
			t.Fatalf("next Receive: %v, want the same failure", again)
		}
	})
}

func TestSendRefuses(t *testing.T) {
	rank, coord := connPair(t, "pipe", Hello{Rank: 0, World: 2}, WithMaxPayload(64))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		c    *Conn
		msg  proto.Message
		want error
	}{
		{"rank sends a coordinator kind", rank, &wirepb.Shutdown{}, nil},
		{"coordinator sends a rank kind", coord, &wirepb.Heartbeat{}, nil},
		{"nil", rank, nil, nil},
		{"not a control message", rank, &wirepb.EpochPlan{}, nil},
		{"over the limit", rank, &wirepb.Ready{Trainer: string(make([]byte, 65))}, authframe.ErrTooLarge},
	} {
		err := tc.c.Send(ctx, tc.msg)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: got %v, want an error (%v)", tc.name, err, tc.want)
		}
	}
}

// Send gives up on ctx while its frame waits in the queue, a Close unblocks
// every Send, and a Send after Close fails.
func TestSendCancelAndClose(t *testing.T) {
	rank, _ := connPair(t, "pipe", Hello{Rank: 0, World: 1}) // nobody reads the coordinator's end
	first := make(chan error, 1)
	go func() { first <- rank.Send(context.Background(), &wirepb.Heartbeat{Counter: 1}) }()
	time.Sleep(20 * time.Millisecond) // the writer now blocks on the unread pipe

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := rank.Send(ctx, &wirepb.Heartbeat{Counter: 2}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued Send: %v, want context.DeadlineExceeded", err)
	}

	closed := make(chan error, 1)
	go func() { closed <- rank.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked behind a stuck write")
	}
	select {
	case err := <-first:
		if err == nil {
			t.Fatal("a Send whose frame was never read reported success")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Send still blocked after Close")
	}
	if err := rank.Send(context.Background(), &wirepb.Heartbeat{}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Send after Close: %v, want net.ErrClosed", err)
	}
	if err := rank.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := rank.Receive(context.Background()); err == nil {
		t.Fatal("Receive after Close succeeded")
	}
}

// A write that cannot finish within the write timeout fails its Send, every
// later Send, and closes the connection so the peer notices.
func TestSendWriteTimeout(t *testing.T) {
	rank, coord := connPair(t, "pipe", Hello{Rank: 0, World: 1}, WithWriteTimeout(50*time.Millisecond))
	if err := rank.Send(context.Background(), &wirepb.Heartbeat{}); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Send: %v, want a write deadline error", err)
	}
	if err := rank.Send(context.Background(), &wirepb.Heartbeat{}); err == nil {
		t.Fatal("Send after a failed write succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := coord.Receive(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("peer Receive: %v, want the connection closed", err)
	}
}
