package wire

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/mtls"
)

// Hello is what a rank says about itself when it connects: its global rank
// and the world size it was started with.
type Hello struct {
	Rank  uint32
	World uint32
}

// A nonce is a side's fresh random contribution to a connection's keys.
type nonce [nonceSize]byte

func newNonce() (nonce, error) {
	var n nonce
	if _, err := rand.Read(n[:]); err != nil {
		return n, fmt.Errorf("wire: handshake nonce: %w", err)
	}
	return n, nil
}

// encodeHello returns the bytes of h with the rank's nonce n, tagged under
// the handshake key hk.
func encodeHello(h Hello, n nonce, hk []byte) [helloSize]byte {
	var b [helloSize]byte
	le.PutUint32(b[0:4], HelloMagic)
	le.PutUint32(b[4:8], Version)
	le.PutUint32(b[8:12], h.Rank)
	le.PutUint32(b[12:16], h.World)
	copy(b[16:32], n[:])
	copy(b[32:40], authframe.Tag(hk, b[0:32]))
	return b
}

// decodeHello checks and decodes a hello: length, magic, version, tag.
func decodeHello(b []byte, hk []byte) (Hello, error) {
	if len(b) != helloSize {
		return Hello{}, fmt.Errorf("%w: hello is %d bytes, want %d", authframe.ErrTruncated, len(b), helloSize)
	}
	if m := le.Uint32(b[0:4]); m != HelloMagic {
		return Hello{}, fmt.Errorf("%w: hello magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, m, HelloMagic)
	}
	if v := le.Uint32(b[4:8]); v != Version {
		return Hello{}, fmt.Errorf("%w: hello version %d, this side speaks %d (run one cohort release on every host)", authframe.ErrBadVersion, v, Version)
	}
	if !authframe.TagOK(hk, b[32:40], b[0:32]) {
		return Hello{}, fmt.Errorf("%w: hello tag does not verify (the rank holds another secret)", authframe.ErrBadTag)
	}
	return Hello{Rank: le.Uint32(b[8:12]), World: le.Uint32(b[12:16])}, nil
}

// encodeChallenge returns the coordinator's challenge answering hello with
// its nonce n: tagged over its own bytes and the hello's, so a recorded
// challenge answers no other hello.
func encodeChallenge(hello []byte, n nonce, hk []byte) [challengeSize]byte {
	var b [challengeSize]byte
	le.PutUint32(b[0:4], ChallengeMagic)
	le.PutUint32(b[4:8], Version)
	copy(b[8:24], n[:])
	copy(b[24:32], authframe.Tag(hk, b[0:24], hello))
	return b
}

// verifyChallenge checks that ch is the coordinator's answer to hello:
// length, magic, version, tag.
func verifyChallenge(ch, hello []byte, hk []byte) error {
	if len(ch) != challengeSize {
		return fmt.Errorf("%w: challenge is %d bytes, want %d", authframe.ErrTruncated, len(ch), challengeSize)
	}
	if err := checkHead(ch, ChallengeMagic, "challenge"); err != nil {
		return err
	}
	if !authframe.TagOK(hk, ch[24:32], ch[0:24], hello) {
		return fmt.Errorf("%w: challenge tag does not verify (the coordinator holds another secret, or the challenge answers another hello)", authframe.ErrBadTag)
	}
	return nil
}

// encodeSeal returns a proof (magic ProofMagic, from the rank) or an ack
// (AckMagic, from the coordinator): a magic, the version and a tag over
// those 8 bytes followed by the handshake so far (bound).
func encodeSeal(magic uint32, hk []byte, bound ...[]byte) [sealSize]byte {
	var b [sealSize]byte
	le.PutUint32(b[0:4], magic)
	le.PutUint32(b[4:8], Version)
	copy(b[8:16], authframe.Tag(hk, append([][]byte{b[0:8]}, bound...)...))
	return b
}

// verifySeal checks a proof or an ack (what names which) against the
// handshake so far.
func verifySeal(b []byte, magic uint32, what string, hk []byte, bound ...[]byte) error {
	if len(b) != sealSize {
		return fmt.Errorf("%w: %s is %d bytes, want %d", authframe.ErrTruncated, what, len(b), sealSize)
	}
	if err := checkHead(b, magic, what); err != nil {
		return err
	}
	if !authframe.TagOK(hk, b[8:16], append([][]byte{b[0:8]}, bound...)...) {
		return fmt.Errorf("%w: %s tag does not verify (another secret, or a %s recorded on another connection)", authframe.ErrBadTag, what, what)
	}
	return nil
}

// checkHead checks the magic and version that open every handshake
// message after the hello.
func checkHead(b []byte, magic uint32, what string) error {
	if m := le.Uint32(b[0:4]); m != magic {
		return fmt.Errorf("%w: %s magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, what, m, magic)
	}
	if v := le.Uint32(b[4:8]); v != Version {
		return fmt.Errorf("%w: %s version %d, want %d", authframe.ErrBadVersion, what, v, Version)
	}
	return nil
}

// checkHello refuses a hello that names no valid rank.
func checkHello(h Hello) error {
	if h.World == 0 || h.Rank >= h.World {
		return fmt.Errorf("rank %d out of range for world size %d", h.Rank, h.World)
	}
	return nil
}

// ClientHandshake runs the rank's side of the handshake on nc: it sends
// hello, verifies the coordinator's challenge, answers it with its proof and
// waits for the ack. The handshake must finish within the handshake timeout
// (10 s by default), or by ctx's deadline if that is sooner; ctx's end
// aborts it. On success the returned Conn owns nc; on failure nc is closed.
// A coordinator that refuses the rank closes the connection without a
// challenge or without an ack, which reads as authframe.ErrTruncated here.
func ClientHandshake(ctx context.Context, nc net.Conn, keys Keys, hello Hello, opts ...Option) (_ *Conn, err error) {
	o := buildOptions(opts)
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if !keys.k.Valid() {
		return nil, errZeroKeys
	}
	if err := checkHello(hello); err != nil {
		return nil, fmt.Errorf("wire: refusing to send hello: %s", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("wire: handshake with %s: %w", nc.RemoteAddr(), err)
	}
	n, err := newNonce()
	if err != nil {
		return nil, err
	}
	hangUp := "the coordinator may have refused the hello (another secret, rank, world size or protocol version), or it may require TLS (worker { tls { ... } })"
	if o.tls != nil {
		tc, err := mtls.Client(ctx, nc, o.tls, o.handshakeTimeout, "the coordinator")
		if err != nil {
			return nil, fmt.Errorf("wire: TLS handshake with %s: %w", nc.RemoteAddr(), err)
		}
		nc, hangUp = tc, "the coordinator may have refused the hello (another secret, rank, world size or protocol version)"
	}
	hk := keys.k.Handshake()
	hb := encodeHello(hello, n, hk)
	var cb [challengeSize]byte
	err = authframe.WithDeadline(ctx, nc, o.handshakeTimeout, func() error {
		if err := exchange(ctx, nc, hb[:], cb[:], "challenge", hangUp); err != nil {
			return err
		}
		if err := verifyChallenge(cb[:], hb[:], hk); err != nil {
			return fmt.Errorf("wire: handshake with %s: %w", nc.RemoteAddr(), err)
		}
		proof := encodeSeal(ProofMagic, hk, hb[:], cb[:])
		var ab [sealSize]byte
		if err := exchange(ctx, nc, proof[:], ab[:], "ack", "the coordinator refused the rank (its slot is taken, or another world size)"); err != nil {
			return err
		}
		if err := verifySeal(ab[:], AckMagic, "ack", hk, hb[:], cb[:], proof[:]); err != nil {
			return fmt.Errorf("wire: handshake with %s: %w", nc.RemoteAddr(), err)
		}
		return nil
	})
	if err != nil {
		// Under TLS 1.3 the coordinator's verdict on this rank's
		// certificate arrives here, as an alert in place of the challenge.
		return nil, mtls.Explain(err, "the coordinator")
	}
	return newConn(nc, keys, hello, hb[:], cb[:challengeCore], dirToCoord, o), nil
}

// exchange writes out and reads exactly len(in) bytes of answer (named
// what); hangUp says what the peer closing without a full answer means.
func exchange(ctx context.Context, nc net.Conn, out, in []byte, what, hangUp string) error {
	if _, err := nc.Write(out); err != nil {
		return fmt.Errorf("wire: send to %s before its %s: %w", nc.RemoteAddr(), what, authframe.CtxCause(ctx, err))
	}
	if n, err := io.ReadFull(nc, in); err != nil {
		if authframe.IsEOF(err) {
			return fmt.Errorf("wire: %w: %s from %s: got %d of %d bytes; %s: %w",
				authframe.ErrTruncated, what, nc.RemoteAddr(), n, len(in), hangUp, err)
		}
		return fmt.Errorf("wire: read %s from %s: got %d of %d bytes: %w", what, nc.RemoteAddr(), n, len(in), authframe.CtxCause(ctx, err))
	}
	return nil
}

// ServerHandshake runs the coordinator's side of the handshake on nc: it
// reads and verifies a rank's hello, answers it with a challenge carrying
// a fresh nonce, reads and verifies the rank's proof, which only a holder
// of the secret can compute for this challenge, then asks accept (which
// may refuse a duplicate or out-of-range rank, or a wrong world size; nil
// accepts any rank below its world size), and sends the ack. A recorded
// hello replayed here therefore never reaches accept: it holds no rank's
// slot and draws no ack. The handshake must finish within the handshake
// timeout (10 s by default), or by ctx's deadline if that is sooner. On
// refusal by accept no ack is sent, the error wraps authframe.ErrRefused
// and accept's error, and the Hello is returned for the log. On success
// the returned Conn owns nc; on failure nc is closed.
func ServerHandshake(ctx context.Context, nc net.Conn, keys Keys, accept func(Hello) error, opts ...Option) (_ *Conn, _ Hello, err error) {
	o := buildOptions(opts)
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if !keys.k.Valid() {
		return nil, Hello{}, errZeroKeys
	}
	if err := ctx.Err(); err != nil {
		return nil, Hello{}, fmt.Errorf("wire: handshake with %s: %w", nc.RemoteAddr(), err)
	}
	if o.tls != nil {
		tc, err := mtls.Server(ctx, nc, o.tls, o.handshakeTimeout, "the rank")
		if err != nil {
			return nil, Hello{}, fmt.Errorf("wire: TLS handshake with %s: %w", nc.RemoteAddr(), err)
		}
		nc = tc
	}
	hk := keys.k.Handshake()
	var (
		hb    [helloSize]byte
		cb    [challengeSize]byte
		hello Hello
	)
	err = authframe.WithDeadline(ctx, nc, o.handshakeTimeout, func() error {
		if err := authframe.ReadHello(ctx, nc, hb[:], "wire"); err != nil {
			return err
		}
		var err error
		if hello, err = decodeHello(hb[:], hk); err != nil {
			return fmt.Errorf("wire: handshake with %s: %w", nc.RemoteAddr(), err)
		}
		if err := checkHello(hello); err != nil {
			return fmt.Errorf("wire: %w: hello from %s: %s", authframe.ErrRefused, nc.RemoteAddr(), err)
		}
		n, err := newNonce()
		if err != nil {
			return err
		}
		cb = encodeChallenge(hb[:], n, hk)
		var pb [sealSize]byte
		if err := exchange(ctx, nc, cb[:], pb[:], "proof", "the peer sent a hello it cannot prove (a replayed hello)"); err != nil {
			return err
		}
		if err := verifySeal(pb[:], ProofMagic, "proof", hk, hb[:], cb[:]); err != nil {
			return fmt.Errorf("wire: handshake with %s (hello of rank %d): %w", nc.RemoteAddr(), hello.Rank, err)
		}
		if accept != nil {
			if err := accept(hello); err != nil {
				return fmt.Errorf("wire: %w: hello from %s (rank %d, world %d): %w", authframe.ErrRefused, nc.RemoteAddr(), hello.Rank, hello.World, err)
			}
		}
		ab := encodeSeal(AckMagic, hk, hb[:], cb[:], pb[:])
		if _, err := nc.Write(ab[:]); err != nil {
			return fmt.Errorf("wire: send ack to %s: %w", nc.RemoteAddr(), authframe.CtxCause(ctx, err))
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, authframe.ErrRefused) {
			return nil, hello, err
		}
		return nil, Hello{}, err
	}
	return newConn(nc, keys, hello, hb[:], cb[:challengeCore], dirToRank, o), hello, nil
}
