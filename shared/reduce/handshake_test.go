package reduce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
)

// The server facing hand-made hellos and proofs: only a hello proved
// against this connection's challenge reaches accept, and nothing else is
// ever acknowledged.
func TestServerHandshakeRefusals(t *testing.T) {
	hk := testKeys.k.Handshake()
	other, err := DeriveKeys([]byte("some other key that is 32 bytes!"))
	if err != nil {
		t.Fatal(err)
	}
	otherHK := other.k.Handshake()
	hb := encodeHello(hello, [16]byte{1}, hk)
	otherHello := encodeHello(Hello{Rank: 0, World: 3, Wire: WireF32}, [16]byte{1}, hk)
	setU32 := func(b []byte, off int, v uint32) []byte {
		c := append([]byte(nil), b...)
		binary.LittleEndian.PutUint32(c[off:], v)
		return c
	}
	// proofFor answers a challenge as a rank holding the key does.
	proofFor := func(ch []byte) []byte { p := encodeProof(hb[:], ch, hk); return p[:] }
	// A proof recorded on an earlier connection: it answered another
	// challenge to the same hello.
	earlier := encodeChallenge(hb[:], [16]byte{2}, hk)
	recorded := encodeProof(hb[:], earlier[:], hk)
	noAccept := func(Hello) error { t.Error("accept consulted for an unproved hello"); return nil }
	cases := []struct {
		name   string
		hello  []byte
		proof  func(challenge []byte) []byte // nil: hang up after the challenge
		accept func(Hello) error
		want   error
		// acked: the rank reads an ack (a refusal's) after its proof.
		acked bool
	}{
		{name: "previous version", hello: setU32(hb[:], 4, 2), want: authframe.ErrBadVersion},
		{name: "another key", hello: func() []byte { b := encodeHello(hello, [16]byte{1}, otherHK); return b[:] }(), want: authframe.ErrBadTag},
		{name: "replayed hello, no proof", hello: hb[:], accept: noAccept, want: authframe.ErrTruncated},
		{name: "replayed hello, recorded proof", hello: hb[:], proof: func([]byte) []byte { return recorded[:] }, accept: noAccept, want: authframe.ErrBadTag},
		{name: "proof under another key", hello: hb[:], proof: func(ch []byte) []byte { p := encodeProof(hb[:], ch, otherHK); return p[:] }, accept: noAccept, want: authframe.ErrBadTag},
		{name: "proof of another hello", hello: hb[:], proof: func(ch []byte) []byte { p := encodeProof(otherHello[:], ch, hk); return p[:] }, accept: noAccept, want: authframe.ErrBadTag},
		{name: "challenge reflected as the proof", hello: hb[:], proof: func(ch []byte) []byte { return ch[:ProofSize] }, accept: noAccept, want: authframe.ErrBadMagic},
		{name: "truncated proof", hello: hb[:], proof: func(ch []byte) []byte { return proofFor(ch)[:ProofSize-1] }, accept: noAccept, want: authframe.ErrTruncated},
		{name: "proved, refused by accept", hello: hb[:], proof: proofFor, want: authframe.ErrRefused, acked: true,
			accept: func(Hello) error { return &Refusal{Status: RefusedDuplicate} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cn, sn := net.Pipe()
			defer cn.Close()
			tail := make(chan []byte, 1) // what the rank read after its proof
			go func() {
				defer close(tail)
				cn.Write(tc.hello)
				ch := make([]byte, ChallengeSize)
				if _, err := io.ReadFull(cn, ch); err != nil {
					return
				}
				if tc.proof == nil {
					cn.Close()
					return
				}
				p := tc.proof(ch)
				cn.Write(p)
				if len(p) < ProofSize {
					cn.Close()
					return
				}
				cn.SetReadDeadline(time.Now().Add(2 * time.Second))
				rest, _ := io.ReadAll(cn)
				tail <- rest
			}()
			c, _, err := ServerHandshake(context.Background(), sn, testKeys, tc.accept, Options{Timeout: 2 * time.Second})
			if c != nil || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", c, err, tc.want)
			}
			rest := <-tail
			if tc.acked != (len(rest) == AckSize) || (!tc.acked && len(rest) != 0) {
				t.Errorf("after its proof the rank read % x; want an ack: %v", rest, tc.acked)
			}
		})
	}
}

// The rank refuses a challenge that does not answer its own hello, and an
// ack that does not close its own handshake, without sending anything
// after them.
func TestClientHandshakeRefusals(t *testing.T) {
	hk := testKeys.k.Handshake()
	other, err := DeriveKeys([]byte("some other key that is 32 bytes!"))
	if err != nil {
		t.Fatal(err)
	}
	earlierHello := encodeHello(hello, [16]byte{9}, hk)
	cases := []struct {
		name      string
		challenge func(hello []byte) []byte
		ack       func(hello, ch, proof []byte) []byte // nil: the challenge fails first
		want      error
	}{
		{name: "challenge under another key", challenge: func(h []byte) []byte { c := encodeChallenge(h, [16]byte{2}, other.k.Handshake()); return c[:] }, want: authframe.ErrBadTag},
		{name: "challenge to an earlier hello", challenge: func([]byte) []byte { c := encodeChallenge(earlierHello[:], [16]byte{2}, hk); return c[:] }, want: authframe.ErrBadTag},
		{name: "hang-up for a challenge", challenge: func([]byte) []byte { return nil }, want: authframe.ErrTruncated},
		{name: "ack of another handshake", challenge: func(h []byte) []byte { c := encodeChallenge(h, [16]byte{2}, hk); return c[:] },
			ack: func(h, ch, p []byte) []byte { a := encodeAck(Accepted, earlierHello[:], ch, p, hk); return a[:] }, want: authframe.ErrBadTag},
		{name: "ack under another key", challenge: func(h []byte) []byte { c := encodeChallenge(h, [16]byte{2}, hk); return c[:] },
			ack: func(h, ch, p []byte) []byte { a := encodeAck(Accepted, h, ch, p, other.k.Handshake()); return a[:] }, want: authframe.ErrBadTag},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cn, sn := net.Pipe()
			defer sn.Close()
			after := make(chan []byte, 1) // what the server read after the last thing it sent
			go func() {
				defer close(after)
				hb := make([]byte, HelloSize)
				if _, err := io.ReadFull(sn, hb); err != nil {
					return
				}
				ch := tc.challenge(hb)
				if ch == nil {
					sn.Close()
					return
				}
				sn.Write(ch)
				if tc.ack != nil {
					p := make([]byte, ProofSize)
					if _, err := io.ReadFull(sn, p); err != nil {
						return
					}
					sn.Write(tc.ack(hb, ch, p))
				}
				sn.SetReadDeadline(time.Now().Add(2 * time.Second))
				rest, _ := io.ReadAll(sn)
				after <- rest
			}()
			c, err := ClientHandshake(context.Background(), cn, testKeys, hello, Options{Timeout: 2 * time.Second})
			if c != nil || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", c, err, tc.want)
			}
			if rest := <-after; len(rest) != 0 {
				t.Errorf("the rank sent % x after a bad answer", rest)
			}
		})
	}
}

// The handshake's bytes follow doc.go, each tag computed here by plain
// HMAC from the data key and the labels alone.
func TestHandshakeBytesFollowTheSpec(t *testing.T) {
	sum := authframe.Sum
	le := binary.LittleEndian
	hk := sum([]byte("a test data key of 32 bytes long"), []byte("cohort/reduce/v1/handshake"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		hb := make([]byte, HelloSize)
		if _, err := io.ReadFull(nc, hb); err != nil {
			got <- err
			return
		}
		if le.Uint32(hb[0:]) != 0xC04ED001 || le.Uint32(hb[4:]) != 3 || !bytes.Equal(hb[136:], sum(hk, hb[:136])[:8]) {
			got <- errors.New("the hello breaks the spec")
			return
		}
		ch := le.AppendUint32(nil, 0xC04ED004)
		ch = le.AppendUint32(ch, 3)
		ch = append(ch, bytes.Repeat([]byte{0xAB}, 16)...)
		ch = append(ch, sum(hk, ch, hb)[:8]...)
		nc.Write(ch)
		p := make([]byte, ProofSize)
		if _, err := io.ReadFull(nc, p); err != nil {
			got <- err
			return
		}
		want := le.AppendUint32(nil, 0xC04ED005)
		want = le.AppendUint32(want, 3)
		want = append(want, sum(hk, want, hb, ch)[:8]...)
		if !bytes.Equal(p, want) {
			got <- errors.New("the proof breaks the spec")
			return
		}
		ack := le.AppendUint32(nil, 0xC04ED002)
		ack = le.AppendUint32(ack, 3)
		ack = le.AppendUint32(ack, uint32(Accepted))
		ack = le.AppendUint32(ack, 0)
		ack = append(ack, sum(hk, ack, hb, ch, p)[:8]...)
		nc.Write(ack)
		got <- nil
		io.Copy(io.Discard, nc)
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ClientHandshake(context.Background(), nc, testKeys, hello, Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("the rank refused a handshake written from the spec: %v", err)
	}
	c.Close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// Hello.Check takes only the wires this release speaks: code 2, the bf16
// of whole parameters, must not meet the bf16 of differences (code 3).
func TestHelloCheckWires(t *testing.T) {
	cases := []struct {
		wire Wire
		ok   bool
	}{
		{WireF32, true},
		{WireBF16, true},
		{0, false},
		{2, false},
		{4, false},
	}
	for _, tc := range cases {
		h := Hello{Rank: 0, World: 2, Wire: tc.wire, Params: 4}
		if err := h.Check(); (err == nil) != tc.ok {
			t.Errorf("wire %d: Check() = %v, want ok %v", uint32(tc.wire), err, tc.ok)
		}
	}
}
