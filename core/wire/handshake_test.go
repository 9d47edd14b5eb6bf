package wire

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
)

// The bytes a real rank puts on the wire, computed here from the
// specification: hello, proof, and the first two frames, answering a
// challenge and an ack also computed from it.
func TestWireBytesFollowTheSpec(t *testing.T) {
	sum := func(key []byte, parts ...[]byte) []byte {
		m := hmac.New(sha256.New, key)
		for _, p := range parts {
			m.Write(p)
		}
		return m.Sum(nil)
	}
	le := binary.LittleEndian
	hk := sum(testSecret, []byte("cohort/wire/v1/handshake"))
	// The rank's nonce is random: the expected hello takes the one it sent.
	helloWith := func(nonce []byte) []byte {
		hello := le.AppendUint32(nil, 0xC04E7001)
		hello = le.AppendUint32(hello, 3)
		hello = le.AppendUint32(hello, 2) // rank
		hello = le.AppendUint32(hello, 4) // world
		hello = append(hello, nonce...)
		return append(hello, sum(hk, hello)[:8]...)
	}

	cn, sn := rawPair(t, "pipe")
	done := make(chan error, 1)
	var rank *Conn
	go func() {
		var err error
		rank, err = ClientHandshake(context.Background(), cn, mustKeys(t, testSecret), Hello{Rank: 2, World: 4})
		done <- err
	}()
	got := make([]byte, 40)
	if _, err := readFullTimeout(sn, got); err != nil {
		t.Fatal(err)
	}
	hello := helloWith(got[16:32])
	if !bytes.Equal(got, hello) {
		t.Fatalf("hello % x, want % x", got, hello)
	}
	if bytes.Equal(got[16:32], make([]byte, 16)) {
		t.Fatal("the hello's nonce is all zeros")
	}
	challenge := le.AppendUint32(nil, 0xC04E7002)
	challenge = le.AppendUint32(challenge, 3)
	challenge = append(challenge, bytes.Repeat([]byte{0xA5}, 16)...) // the coordinator's nonce
	challenge = append(challenge, sum(hk, challenge, hello)[:8]...)
	frameKey := sum(sum(testSecret, []byte("cohort/wire/v1/rank-to-coordinator")), hello, challenge[:24])
	if _, err := sn.Write(challenge); err != nil {
		t.Fatal(err)
	}
	proof := le.AppendUint32(nil, 0xC04E7004)
	proof = le.AppendUint32(proof, 3)
	proof = append(proof, sum(hk, proof, hello, challenge)[:8]...)
	gotProof := make([]byte, 16)
	if _, err := readFullTimeout(sn, gotProof); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gotProof, proof) {
		t.Fatalf("proof % x, want % x", gotProof, proof)
	}
	ack := le.AppendUint32(nil, 0xC04E7005)
	ack = le.AppendUint32(ack, 3)
	ack = append(ack, sum(hk, ack, hello, challenge, proof)[:8]...)
	if _, err := sn.Write(ack); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the rank refused the challenge or ack computed from the spec: %v", err)
	}
	defer rank.Close()
	msg := &wirepb.Exiting{Rank: 2}
	_, payload, _ := Encode(msg)
	for seq := uint64(0); seq < 2; seq++ {
		go rank.Send(context.Background(), msg)
		frame := make([]byte, headerSize+len(payload))
		if _, err := readFullTimeout(sn, frame); err != nil {
			t.Fatal(err)
		}
		want := le.AppendUint32(nil, 0xC04E7003)
		want = le.AppendUint32(want, 3)
		tail := le.AppendUint32(nil, uint32(wirepb.FrameKind_FRAME_KIND_EXITING))
		tail = le.AppendUint32(tail, uint32(len(payload)))
		want = append(want, sum(frameKey, le.AppendUint64(nil, seq), tail, payload)[:8]...)
		want = append(append(want, tail...), payload...)
		if !bytes.Equal(frame, want) {
			t.Fatalf("frame %d\n got % x\nwant % x", seq, frame, want)
		}
	}
}

func TestHandshakeRejections(t *testing.T) {
	keys := mustKeys(t, testSecret)
	otherKeys := mustKeys(t, otherSecret)
	hk, otherHK := keys.k.Handshake(), otherKeys.k.Handshake()
	hello := Hello{Rank: 1, World: 2}
	hb := encodeHello(hello, testNonce(1), hk)
	setU32 := func(b []byte, off int, v uint32) []byte {
		c := append([]byte(nil), b...)
		binary.LittleEndian.PutUint32(c[off:], v)
		return c
	}
	goodChallenge := encodeChallenge(hb[:], testNonce(2), hk)
	otherHello := encodeHello(Hello{Rank: 0, World: 2}, testNonce(1), hk)
	sameHelloOtherNonce := encodeHello(hello, testNonce(3), hk)
	forged := func(h Hello) []byte { b := encodeHello(h, testNonce(1), hk); return b[:] }
	// proofFor answers a challenge as a rank holding the secret does.
	proofFor := func(ch []byte) []byte { b := encodeSeal(ProofMagic, hk, hb[:], ch); return b[:] }
	// A proof recorded on an earlier connection: it answered another
	// challenge to the same hello.
	recordedProof := encodeSeal(ProofMagic, hk, hb[:], goodChallenge[:])
	noAccept := func(Hello) error { t.Error("accept consulted for an unproved hello"); return nil }

	// The coordinator's side, facing hand-made hellos and proofs.
	serverCases := []struct {
		name     string
		hello    []byte
		proof    func(challenge []byte) []byte // nil: hang up after the challenge
		accept   func(Hello) error
		want     error
		wantSeen Hello // the Hello returned with a refusal
	}{
		{name: "wrong magic", hello: setU32(hb[:], 0, 0xF10D17C2), want: authframe.ErrBadMagic},
		{name: "previous version", hello: setU32(hb[:], 4, 2), want: authframe.ErrBadVersion},
		{name: "wrong secret", hello: func() []byte { b := encodeHello(hello, testNonce(1), otherHK); return b[:] }(), want: authframe.ErrBadTag},
		{name: "forged rank", hello: setU32(hb[:], 8, 0), want: authframe.ErrBadTag},
		{name: "forged nonce", hello: func() []byte { c := append([]byte(nil), hb[:]...); c[16] ^= 1; return c }(), want: authframe.ErrBadTag},
		{name: "flipped tag bit", hello: func() []byte { c := append([]byte(nil), hb[:]...); c[36] ^= 1; return c }(), want: authframe.ErrBadTag},
		{name: "truncated", hello: hb[:10], want: authframe.ErrTruncated},
		{name: "empty", hello: nil, want: authframe.ErrTruncated},
		{name: "rank out of range", hello: forged(Hello{Rank: 2, World: 2}), want: authframe.ErrRefused, wantSeen: Hello{Rank: 2, World: 2}, accept: noAccept},
		{name: "zero world", hello: forged(Hello{Rank: 0, World: 0}), want: authframe.ErrRefused},
		{name: "replayed hello, no proof", hello: hb[:], accept: noAccept, want: authframe.ErrTruncated},
		{name: "replayed hello, recorded proof", hello: hb[:], proof: func([]byte) []byte { return recordedProof[:] }, accept: noAccept, want: authframe.ErrBadTag},
		{name: "proof under another secret", hello: hb[:], proof: func(ch []byte) []byte { b := encodeSeal(ProofMagic, otherHK, hb[:], ch); return b[:] }, accept: noAccept, want: authframe.ErrBadTag},
		{name: "proof of another hello", hello: hb[:], proof: func(ch []byte) []byte { b := encodeSeal(ProofMagic, hk, otherHello[:], ch); return b[:] }, accept: noAccept, want: authframe.ErrBadTag},
		{name: "challenge reflected as the proof", hello: hb[:], proof: func(ch []byte) []byte { return ch[:sealSize] }, accept: noAccept, want: authframe.ErrBadMagic},
		{name: "ack-shaped proof", hello: hb[:], proof: func(ch []byte) []byte { b := encodeSeal(AckMagic, hk, hb[:], ch); return b[:] }, accept: noAccept, want: authframe.ErrBadMagic},
		{name: "truncated proof", hello: hb[:], proof: func(ch []byte) []byte { return proofFor(ch)[:sealSize-1] }, accept: noAccept, want: authframe.ErrTruncated},
		{name: "refused by accept", hello: hb[:], proof: proofFor, want: authframe.ErrRefused, wantSeen: hello,
			accept: func(h Hello) error { return errors.New("rank 1 already connected") }},
	}
	for _, tc := range serverCases {
		t.Run("server/"+tc.name, func(t *testing.T) {
			cn, sn := rawPair(t, "pipe")
			tail := make(chan []byte, 1) // what the rank read after its last message
			go func() {
				defer close(tail)
				cn.Write(tc.hello)
				if len(tc.hello) < helloSize {
					cn.Close()
					return
				}
				ch := make([]byte, challengeSize)
				if _, err := io.ReadFull(cn, ch); err != nil {
					return
				}
				if tc.proof == nil {
					cn.Close()
					return
				}
				p := tc.proof(ch)
				cn.Write(p)
				if len(p) < sealSize {
					cn.Close()
					return
				}
				cn.SetReadDeadline(time.Now().Add(2 * time.Second))
				rest, _ := io.ReadAll(cn)
				tail <- rest
			}()
			c, seen, err := ServerHandshake(context.Background(), sn, keys, tc.accept)
			if c != nil || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", c, err, tc.want)
			}
			if seen != tc.wantSeen {
				t.Errorf("returned hello %+v, want %+v", seen, tc.wantSeen)
			}
			if rest := <-tail; len(rest) != 0 {
				t.Errorf("after a refused proof the rank read % x; want no ack and the connection closed", rest)
			}
		})
	}

	// The rank's side, facing hand-made challenges, then hand-made acks
	// after a good challenge to its real hello.
	clientCases := []struct {
		name      string
		challenge []byte                               // nil: a good one
		ack       func(hello, ch, proof []byte) []byte // after a good challenge
		want      error
	}{
		{name: "wrong magic", challenge: setU32(goodChallenge[:], 0, 0xF10D17C3), want: authframe.ErrBadMagic},
		{name: "wrong version", challenge: setU32(goodChallenge[:], 4, 6), want: authframe.ErrBadVersion},
		{name: "challenge under another secret", challenge: func() []byte { b := encodeChallenge(hb[:], testNonce(2), otherHK); return b[:] }(), want: authframe.ErrBadTag},
		{name: "challenge bound to another hello", challenge: func() []byte { b := encodeChallenge(otherHello[:], testNonce(2), hk); return b[:] }(), want: authframe.ErrBadTag},
		{name: "challenge to an earlier hello of this rank", challenge: func() []byte { b := encodeChallenge(sameHelloOtherNonce[:], testNonce(2), hk); return b[:] }(), want: authframe.ErrBadTag},
		{name: "truncated challenge", challenge: goodChallenge[:challengeSize-1], want: authframe.ErrTruncated},
		{name: "no challenge", challenge: []byte{}, want: authframe.ErrTruncated},
		{name: "no ack (refused)", ack: func(_, _, _ []byte) []byte { return nil }, want: authframe.ErrTruncated},
		{name: "ack under another secret", ack: func(h, ch, p []byte) []byte { b := encodeSeal(AckMagic, otherHK, h, ch, p); return b[:] }, want: authframe.ErrBadTag},
		{name: "ack of another connection", ack: func(h, _, p []byte) []byte { b := encodeSeal(AckMagic, hk, h, goodChallenge[:], p); return b[:] }, want: authframe.ErrBadTag},
		{name: "proof reflected as the ack", ack: func(_, _, p []byte) []byte { return p }, want: authframe.ErrBadMagic},
		{name: "ack of another version", ack: func(h, ch, p []byte) []byte { b := encodeSeal(AckMagic, hk, h, ch, p); return setU32(b[:], 4, 2) }, want: authframe.ErrBadVersion},
	}
	for _, tc := range clientCases {
		t.Run("client/"+tc.name, func(t *testing.T) {
			cn, sn := rawPair(t, "pipe")
			go func() {
				defer sn.Close()
				h := make([]byte, helloSize)
				if _, err := io.ReadFull(sn, h); err != nil {
					return
				}
				if tc.challenge != nil {
					sn.Write(tc.challenge)
					return
				}
				ch := encodeChallenge(h, testNonce(2), hk)
				sn.Write(ch[:])
				p := make([]byte, sealSize)
				if _, err := io.ReadFull(sn, p); err != nil {
					return
				}
				sn.Write(tc.ack(h, ch[:], p))
			}()
			c, err := ClientHandshake(context.Background(), cn, keys, hello)
			if c != nil || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", c, err, tc.want)
			}
		})
	}

	// Both sides real.
	t.Run("both/secrets differ", func(t *testing.T) {
		cerr, serr := realHandshake(t, keys, otherKeys, hello, nil)
		if !errors.Is(serr, authframe.ErrBadTag) || !errors.Is(cerr, authframe.ErrTruncated) {
			t.Fatalf("client %v, server %v; want authframe.ErrTruncated, authframe.ErrBadTag", cerr, serr)
		}
	})
	t.Run("both/refused by accept", func(t *testing.T) {
		errWorld := errors.New("world size 2, coordinator runs 4")
		cerr, serr := realHandshake(t, keys, keys, hello, func(Hello) error { return errWorld })
		if !errors.Is(serr, authframe.ErrRefused) || !errors.Is(serr, errWorld) {
			t.Fatalf("server %v; want authframe.ErrRefused wrapping accept's error", serr)
		}
		if !errors.Is(cerr, authframe.ErrTruncated) {
			t.Fatalf("client %v; want authframe.ErrTruncated (no ack)", cerr)
		}
	})
	t.Run("client refuses an out-of-range hello", func(t *testing.T) {
		cn, _ := rawPair(t, "pipe")
		if _, err := ClientHandshake(context.Background(), cn, keys, Hello{Rank: 4, World: 4}); err == nil {
			t.Fatal("accepted rank 4 of 4")
		}
	})
}

func realHandshake(t *testing.T, ck, sk Keys, hello Hello, accept func(Hello) error) (cerr, serr error) {
	t.Helper()
	cn, sn := rawPair(t, "tcp")
	ch := make(chan error, 1)
	go func() {
		c, _, err := ServerHandshake(context.Background(), sn, sk, accept, WithHandshakeTimeout(5*time.Second))
		if c != nil {
			c.Close()
		}
		ch <- err
	}()
	c, cerr := ClientHandshake(context.Background(), cn, ck, hello, WithHandshakeTimeout(5*time.Second))
	if c != nil {
		c.Close()
	}
	return cerr, <-ch
}

// A peer that never speaks cannot hold a handshake past its deadline.
func TestHandshakeDeadline(t *testing.T) {
	keys := mustKeys(t, testSecret)
	const limit = 150 * time.Millisecond
	type result struct {
		err     error
		elapsed time.Duration
	}
	cases := []struct {
		name string
		run  func(ctx context.Context, cn, sn net.Conn) error
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{
			name: "server, silent client, handshake timeout",
			run: func(ctx context.Context, _, sn net.Conn) error {
				_, _, err := ServerHandshake(ctx, sn, keys, nil, WithHandshakeTimeout(limit))
				return err
			},
			want: os.ErrDeadlineExceeded,
		},
		{
			name: "server, silent client, ctx deadline sooner than the default",
			run: func(ctx context.Context, _, sn net.Conn) error {
				_, _, err := ServerHandshake(ctx, sn, keys, nil)
				return err
			},
			ctx:  func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), limit) },
			want: context.DeadlineExceeded,
		},
		{
			name: "server, silent client, ctx cancelled",
			run: func(ctx context.Context, _, sn net.Conn) error {
				_, _, err := ServerHandshake(ctx, sn, keys, nil)
				return err
			},
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(limit, cancel)
				return ctx, cancel
			},
			want: context.Canceled,
		},
		{
			name: "client, server reads the hello and never challenges",
			run: func(ctx context.Context, cn, sn net.Conn) error {
				go io.Copy(io.Discard, sn)
				_, err := ClientHandshake(ctx, cn, keys, Hello{Rank: 0, World: 1}, WithHandshakeTimeout(limit))
				return err
			},
			want: os.ErrDeadlineExceeded,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cn, sn := rawPair(t, "pipe")
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			ch := make(chan result, 1)
			start := time.Now()
			go func() {
				err := tc.run(ctx, cn, sn)
				ch <- result{err, time.Since(start)}
			}()
			select {
			case r := <-ch:
				if !errors.Is(r.err, tc.want) {
					t.Fatalf("got %v, want %v", r.err, tc.want)
				}
				if r.elapsed < limit-10*time.Millisecond {
					t.Fatalf("gave up after %v, before the %v deadline", r.elapsed, limit)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("handshake still blocked 5 s after a 150 ms deadline")
			}
		})
	}
}
