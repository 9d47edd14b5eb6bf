package reduce

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// Fuzz targets for every decoder of the data channel. Each decoder must
// never panic, never allocate more than its input justifies, and accept
// only canonical input: what it accepts re-encodes to the same bytes.

func roundTrip[T any](t *testing.T, b []byte, dec func([]byte) (T, error), enc func(T) []byte) {
	v, err := dec(b)
	if err != nil {
		return
	}
	if out := enc(v); !bytes.Equal(out, b) {
		t.Fatalf("accepted %x, re-encodes to %x", b, out)
	}
}

func FuzzDecodeJoin(f *testing.F) {
	f.Add(Join{ArenaPath: "/dev/shm/cohort-r0.arena", Dev: 1, Ino: 2, PID: 3, RingPort: 4242}.Encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeJoin, Join.Encode) })
}

func FuzzDecodeAnnounce(f *testing.F) {
	f.Add(Announce{Round: 3, Session: 1, Steps: 10, Weight: 10, Broadcast: true, Root: 2, OuterSteps: 4, OuterID: [8]byte{9}}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeAnnounce, Announce.Encode) })
}

func FuzzDecodeRoundRef(f *testing.F) {
	f.Add(RoundRef{Round: 7}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		roundTrip(t, b, func(b []byte) (RoundRef, error) { return DecodeRoundRef(KindFolded, b) }, RoundRef.Encode)
	})
}

func FuzzDecodeDone(f *testing.F) {
	f.Add(Done{Round: 2, Post2: 1.5, Parts: []Partial{{Rank: 0, Diff2: 1, Pre2: 2}, {Rank: 3, Diff2: 0, Pre2: 4}}}.Encode())
	f.Add([]byte("\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xf0?\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeDone, Done.Encode) })
}

func FuzzDecodeAbort(f *testing.F) {
	f.Add(Abort{Round: 4, Reason: "rank 3 died"}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeAbort, Abort.Encode) })
}

func FuzzDecodeSession(f *testing.F) {
	f.Add(Session{Generation: 2, Members: []uint32{0, 2, 3}}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeSession, Session.Encode) })
}

func FuzzDecodeTopology(f *testing.F) {
	f.Add(Topology{Generation: 1, Hosts: 2, Host: 1, Peers: []Peer{{Rank: 1, Dev: 5, Ino: 6, Path: "/dev/shm/a"}, {Rank: 4, Path: "/dev/shm/b"}},
		Leaders: []string{"10.0.0.1:4000", "10.0.0.2:4000"}}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeTopology, Topology.Encode) })
}

func FuzzDecodePlan(f *testing.F) {
	f.Add(Plan{Round: 9, Topology: 2, Realized: true, Hosts: 1, TotalWeight: 5, TotalMovers: 2, Parts: []PlanPart{{Rank: 0, Weight: 2}, {Rank: 1, Weight: 3}}}.Encode())
	f.Add(Plan{Round: 1, Realized: true, Broadcast: true, Seed: true, Root: 1, Hosts: 3, Parts: []PlanPart{{Rank: 1}}}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodePlan, Plan.Encode) })
}

func FuzzDecodeResult(f *testing.F) {
	f.Add(Result{Round: 1, Diff2: 1, Pre2: 2, Post2: 3, Bytes: 4}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeResult, Result.Encode) })
}

func FuzzDecodeFail(f *testing.F) {
	f.Add(Fail{Round: 1, Reason: "rank 2 was declared dead"}.Encode())
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, DecodeFail, Fail.Encode) })
}

func FuzzDecodeEmpty(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if DecodeEmpty(KindBye, b) == nil && len(b) != 0 {
			t.Fatal("accepted a non-empty payload")
		}
	})
}

var fuzzKeys, _ = DeriveKeys([]byte("fuzzing data key, thirty-two by."))

func FuzzDecodeHello(f *testing.F) {
	h := Hello{Rank: 1, World: 4, Wire: WireBF16, Params: 100, Buffers: 3, Host: [16]byte{7}}
	good := encodeHello(h, [16]byte{1}, fuzzKeys.k.Handshake())
	f.Add(good[:])
	f.Add(good[:100])
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeHello(b, fuzzKeys)
		if err != nil {
			return
		}
		var nonce [16]byte
		copy(nonce[:], b[120:136])
		if out := encodeHello(got, nonce, fuzzKeys.k.Handshake()); !bytes.Equal(out[:], b) {
			t.Fatalf("accepted hello %x re-encodes to %x", b, out)
		}
	})
}

// fuzzHandshake is one handshake's bytes under fuzzKeys, for the
// decoders of the messages after the hello.
var (
	fuzzHSHello     = encodeHello(Hello{Rank: 0, World: 1, Wire: WireF32}, [16]byte{}, fuzzKeys.k.Handshake())
	fuzzHSChallenge = encodeChallenge(fuzzHSHello[:], [16]byte{5}, fuzzKeys.k.Handshake())
	fuzzHSProof     = encodeProof(fuzzHSHello[:], fuzzHSChallenge[:], fuzzKeys.k.Handshake())
)

func FuzzVerifyChallenge(f *testing.F) {
	f.Add(fuzzHSChallenge[:])
	f.Add(fuzzHSProof[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		if verifyChallenge(b, fuzzHSHello[:], fuzzKeys) != nil {
			return
		}
		var nonce [16]byte
		copy(nonce[:], b[8:24])
		if out := encodeChallenge(fuzzHSHello[:], nonce, fuzzKeys.k.Handshake()); !bytes.Equal(out[:], b) {
			t.Fatalf("accepted challenge %x re-encodes to %x", b, out)
		}
	})
}

func FuzzVerifyProof(f *testing.F) {
	f.Add(fuzzHSProof[:])
	f.Add(fuzzHSChallenge[:ProofSize])
	f.Fuzz(func(t *testing.T, b []byte) {
		if verifyProof(b, fuzzHSHello[:], fuzzHSChallenge[:], fuzzKeys) != nil {
			return
		}
		// One proof answers a given hello and challenge.
		if !bytes.Equal(b, fuzzHSProof[:]) {
			t.Fatalf("accepted proof %x, the only one is %x", b, fuzzHSProof)
		}
	})
}

func FuzzDecodeAck(f *testing.F) {
	ack := encodeAck(RefusedDuplicate, fuzzHSHello[:], fuzzHSChallenge[:], fuzzHSProof[:], fuzzKeys.k.Handshake())
	f.Add(ack[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeAck(b, fuzzHSHello[:], fuzzHSChallenge[:], fuzzHSProof[:], fuzzKeys)
		if err != nil {
			return
		}
		if out := encodeAck(st, fuzzHSHello[:], fuzzHSChallenge[:], fuzzHSProof[:], fuzzKeys.k.Handshake()); !bytes.Equal(out[:], b) {
			t.Fatalf("accepted ack %x re-encodes to %x", b, out)
		}
	})
}

// bytesConn is a net.Conn that reads a fixed input and discards writes.
type bytesConn struct{ r *bytes.Reader }

func (c *bytesConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *bytesConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *bytesConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }

// fuzzStream is the bytes a rank with fuzzHello would send: frames signed
// under the connection's up key, in sequence.
var (
	fuzzHello         = Hello{Rank: 0, World: 2, Wire: WireBF16, Params: 6, Buffers: 2}
	fuzzHelloB        = encodeHello(fuzzHello, [16]byte{}, fuzzKeys.k.Handshake())
	fuzzChallengeCore = make([]byte, challengeCore)
)

func signedStream(frames ...[]any) []byte {
	var out []byte
	pipeA, pipeB := net.Pipe()
	// A long timeout: a quiet connection pings every Timeout/4, and a
	// ping in the stream would break the byte-exact checks on a busy
	// machine.
	c := newConn(pipeA, fuzzKeys, fuzzHello, fuzzHelloB[:], fuzzChallengeCore, ToServer, Options{Timeout: time.Hour})
	done := make(chan struct{})
	go func() {
		out, _ = io.ReadAll(pipeB)
		close(done)
	}()
	for _, f := range frames {
		parts := make([][]byte, 0, len(f)-1)
		for _, p := range f[1:] {
			parts = append(parts, p.([]byte))
		}
		if d, err := c.SendAsync(f[0].(Kind), parts...); err == nil {
			<-d
		}
	}
	c.Close()
	<-done
	return out
}

// FuzzReceive feeds arbitrary bytes to the server end of a connection: the
// frame layer must refuse or verify, never panic.
func FuzzReceive(f *testing.F) {
	f.Add(signedStream([]any{KindAnnounce, Announce{Round: 1, Steps: 2, Weight: 2}.Encode()}))
	f.Add(signedStream(
		[]any{KindJoin, Join{ArenaPath: "/a", PID: 1, RingPort: 9}.Encode()},
		[]any{KindFolded, RoundRef{Round: 2}.Encode()},
	))
	f.Add([]byte("\x03\xd0\x4e\xc0\x02\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := newConn(&bytesConn{r: bytes.NewReader(b)}, fuzzKeys, fuzzHello, fuzzHelloB[:], fuzzChallengeCore, ToRank, Options{Timeout: time.Second})
		defer c.Close()
		for i := 0; i < 8; i++ {
			fr, err := c.Receive()
			if err != nil {
				return
			}
			if fr.Kind.Dir() != ToServer || !fr.Kind.Known() {
				t.Fatalf("accepted %v", fr.Kind)
			}
		}
	})
}
