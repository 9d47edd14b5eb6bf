package reduce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
)

var testKeys, _ = DeriveKeys([]byte("a test data key of 32 bytes long"))

// pair returns the two ends of a handshaken TCP connection.
func pair(t *testing.T, h Hello, accept func(Hello) error, wrap func(net.Conn) net.Conn) (*Conn, *Conn, error, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *Conn
		err error
	}
	srv := make(chan res, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			srv <- res{nil, err}
			return
		}
		c, _, err := ServerHandshake(context.Background(), nc, testKeys, accept, Options{Timeout: 2 * time.Second})
		srv <- res{c, err}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		nc = wrap(nc)
	}
	cc, cerr := ClientHandshake(context.Background(), nc, testKeys, h, Options{Timeout: 2 * time.Second})
	s := <-srv
	if cc != nil {
		t.Cleanup(func() { cc.Close() })
	}
	if s.c != nil {
		t.Cleanup(func() { s.c.Close() })
	}
	return cc, s.c, cerr, s.err
}

var hello = Hello{Rank: 1, World: 3, Wire: WireBF16, Params: 5, Buffers: 3, Run: RunDigest("r")}

func TestFramesBothWays(t *testing.T) {
	cc, sc, cerr, serr := pair(t, hello, nil, nil)
	if cerr != nil || serr != nil {
		t.Fatal(cerr, serr)
	}
	if err := cc.Send(context.Background(), KindAnnounce, Announce{Round: 1, Steps: 2, Weight: 2}.Encode()); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte{7}, MaxControlPayload) // streamed in chunks
	if err := cc.Send(context.Background(), KindAbort, big[:8], big[8:]); err != nil {
		t.Fatal(err)
	}
	f, err := sc.Receive()
	if err != nil || f.Kind != KindAnnounce {
		t.Fatal(f.Kind, err)
	}
	if a, err := DecodeAnnounce(f.Payload); err != nil || a.Round != 1 {
		t.Fatal(a, err)
	}
	f, err = sc.Receive()
	if err != nil || f.Kind != KindAbort || !bytes.Equal(f.Payload, big) {
		t.Fatal(f.Kind, err, len(f.Payload))
	}
	// Wrong direction and wrong size are refused on the sending side.
	if _, err := cc.SendAsync(KindPlan, nil); err == nil {
		t.Fatal("rank sent a server kind")
	}
	if _, err := cc.SendAsync(KindAbort, make([]byte, MaxControlPayload+1)); !errors.Is(err, authframe.ErrTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
	if err := sc.Send(context.Background(), KindResult, Result{Round: 1}.Encode()); err != nil {
		t.Fatal(err)
	}
	if f, err := cc.Receive(); err != nil || f.Kind != KindResult {
		t.Fatal(f.Kind, err)
	}
}

// recorder keeps what a client writes after its hello.
type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.buf.Write(b)
	return r.Conn.Write(b)
}

// TestReplayRefused: a recorded frame written again (replayed) and frames
// out of order fail their tag.
func TestReplayRefused(t *testing.T) {
	var rec *recorder
	cc, sc, cerr, serr := pair(t, hello, nil, func(nc net.Conn) net.Conn { rec = &recorder{Conn: nc}; return rec })
	if cerr != nil || serr != nil {
		t.Fatal(cerr, serr)
	}
	cc.Send(context.Background(), KindFolded, RoundRef{Round: 1}.Encode())
	if _, err := sc.Receive(); err != nil {
		t.Fatal(err)
	}
	frame := rec.buf.Bytes()[HelloSize+ProofSize:]
	rec.Conn.Write(frame) // the same bytes again
	if _, err := sc.Receive(); !errors.Is(err, authframe.ErrBadTag) {
		t.Fatalf("replayed frame: %v", err)
	}
	// The stream is over for good.
	if _, err := sc.Receive(); !errors.Is(err, authframe.ErrBadTag) {
		t.Fatalf("after a refusal: %v", err)
	}
}

// TestRefusalCarriesReason: a refused rank learns why, from a tagged ack.
func TestRefusalCarriesReason(t *testing.T) {
	_, _, cerr, serr := pair(t, hello, func(Hello) error { return &Refusal{Status: RefusedDuplicate} }, nil)
	var r *Refusal
	if !errors.As(cerr, &r) || r.Status != RefusedDuplicate || !errors.Is(cerr, authframe.ErrRefused) {
		t.Fatalf("client: %v", cerr)
	}
	if !errors.Is(serr, authframe.ErrRefused) {
		t.Fatalf("server: %v", serr)
	}
}

// TestWrongKeyUnanswered: the server does not answer a hello under another
// key; the rank sees the connection close.
func TestWrongKeyUnanswered(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	serr := make(chan error, 1)
	go func() {
		nc, _ := ln.Accept()
		_, _, err := ServerHandshake(context.Background(), nc, testKeys, nil, Options{Timeout: time.Second})
		serr <- err
	}()
	other, _ := DeriveKeys([]byte("some other key that is 32 bytes!"))
	nc, _ := net.Dial("tcp", ln.Addr().String())
	_, err := ClientHandshake(context.Background(), nc, other, hello, Options{Timeout: time.Second})
	if !errors.Is(err, authframe.ErrTruncated) {
		t.Fatalf("client: %v", err)
	}
	if err := <-serr; !errors.Is(err, authframe.ErrBadTag) {
		t.Fatalf("server: %v", err)
	}
}

// TestSilentPeerTimesOut: a peer that sends nothing within the timeout is
// reported gone, not waited on forever.
func TestSilentPeerTimesOut(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go io.Copy(io.Discard, b)
	c := newConn(a, testKeys, hello, make([]byte, HelloSize), make([]byte, challengeCore), ToRank, Options{Timeout: 200 * time.Millisecond})
	defer c.Close()
	t0 := time.Now()
	_, err := c.Receive()
	if err == nil || time.Since(t0) > 2*time.Second {
		t.Fatalf("silent peer: %v after %v", err, time.Since(t0))
	}
}

func TestKeysNeverPrint(t *testing.T) {
	if s := fmtSprint(testKeys); s != "reduce.Keys{redacted}" {
		t.Fatal(s)
	}
	if _, err := DeriveKeys([]byte("short")); err == nil {
		t.Fatal("short key accepted")
	}
}

func fmtSprint(v any) string { return fmt.Sprintf("%v %x", v, v)[:len("reduce.Keys{redacted}")] }

// A frame cut off before its tag is refused as truncated, except a
// goodbye: the rank is leaving either way, and saying so keeps a rank's
// ordinary exit out of the error log.
func TestCutGoodbye(t *testing.T) {
	cases := []struct {
		name string
		kind Kind
		want error
	}{
		{"goodbye", KindBye, ErrByeCut},
		{"announce", KindAnnounce, authframe.ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var payload []byte
			if c.kind == KindAnnounce {
				payload = Announce{Round: 1, Steps: 1, Weight: 1}.Encode()
			}
			stream := signedStream([]any{c.kind, payload})
			conn := newConn(&bytesConn{r: bytes.NewReader(stream[:len(stream)-3])}, fuzzKeys, fuzzHello, fuzzHelloB[:], fuzzChallengeCore, ToRank, Options{Timeout: time.Second})
			defer conn.Close()
			_, err := conn.Receive()
			if !errors.Is(err, c.want) {
				t.Fatalf("Receive = %v, want %v", err, c.want)
			}
		})
	}
}
