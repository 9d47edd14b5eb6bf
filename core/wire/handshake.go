package wire

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
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
		return Hello{}, fmt.Errorf("%w: hello version %d, want %d", authframe.ErrBadVersion, v, Version)
	}
	if !authframe.TagOK(hk, b[32:40], b[0:32]) {
		return Hello{}, fmt.Errorf("%w: hello tag does not verify (the rank holds another secret)", authframe.ErrBadTag)
	}
	return Hello{Rank: le.Uint32(b[8:12]), World: le.Uint32(b[12:16])}, nil
}

// encodeAck returns the ack answering hello with the coordinator's nonce n.
func encodeAck(hello []byte, n nonce, hk []byte) [ackSize]byte {
	var b [ackSize]byte
	le.PutUint32(b[0:4], AckMagic)
	le.PutUint32(b[4:8], Version)
	copy(b[8:24], n[:])
	copy(b[24:32], authframe.Tag(hk, b[0:24], hello))
	return b
}

// verifyAck checks that ack is the coordinator's answer to hello: length,
// magic, version, tag.
func verifyAck(ack, hello []byte, hk []byte) error {
	if len(ack) != ackSize {
		return fmt.Errorf("%w: ack is %d bytes, want %d", authframe.ErrTruncated, len(ack), ackSize)
	}
	if m := le.Uint32(ack[0:4]); m != AckMagic {
		return fmt.Errorf("%w: ack magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, m, AckMagic)
	}
	if v := le.Uint32(ack[4:8]); v != Version {
		return fmt.Errorf("%w: ack version %d, want %d", authframe.ErrBadVersion, v, Version)
	}
	if !authframe.TagOK(hk, ack[24:32], ack[0:24], hello) {
		return fmt.Errorf("%w: ack tag does not verify (the coordinator holds another secret, or the ack answers another hello)", authframe.ErrBadTag)
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
// hello, waits for the coordinator's ack and verifies it. The handshake must
// finish within the handshake timeout (10 s by default), or by ctx's
// deadline if that is sooner; ctx's end aborts it. On success the returned
// Conn owns nc; on failure nc is closed. A coordinator that refuses the hello
// closes the connection without an ack, which reads as authframe.ErrTruncated here.
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
	hangUp := "the coordinator may have refused the hello (another secret, rank or world size), or it may require TLS (worker { tls { ... } })"
	if o.tls != nil {
		tc, err := mtls.Client(ctx, nc, o.tls, o.handshakeTimeout, "the coordinator")
		if err != nil {
			return nil, fmt.Errorf("wire: TLS handshake with %s: %w", nc.RemoteAddr(), err)
		}
		nc, hangUp = tc, "the coordinator may have refused the hello (another secret, rank or world size)"
	}
	hb := encodeHello(hello, n, keys.k.Handshake())
	var ab [ackSize]byte
	err = authframe.SendHello(ctx, nc, o.handshakeTimeout, hb[:], ab[:], "wire", hangUp,
		func() error { return verifyAck(ab[:], hb[:], keys.k.Handshake()) })
	if err != nil {
		// Under TLS 1.3 the coordinator's verdict on this rank's
		// certificate arrives here, as an alert in place of the ack.
		return nil, mtls.Explain(err, "the coordinator")
	}
	return newConn(nc, keys, hello, hb[:], ab[:ackCore], dirToCoord, o), nil
}

// ServerHandshake runs the coordinator's side of the handshake on nc: it
// reads and verifies a rank's hello, asks accept (which may refuse a
// duplicate or out-of-range rank, or a wrong world size; nil accepts any
// rank below its world size), and answers with an ack. The hello must arrive
// within the handshake timeout (10 s by default), or by ctx's deadline if
// that is sooner. On refusal no ack is sent, the error wraps authframe.ErrRefused and
// accept's error, and the Hello is returned for the log. On success the
// returned Conn owns nc; on failure nc is closed.
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
	var (
		hb    [helloSize]byte
		ab    [ackSize]byte
		hello Hello
	)
	err = authframe.WithDeadline(ctx, nc, o.handshakeTimeout, func() error {
		if err := authframe.ReadHello(ctx, nc, hb[:], "wire"); err != nil {
			return err
		}
		var err error
		if hello, err = decodeHello(hb[:], keys.k.Handshake()); err != nil {
			return fmt.Errorf("wire: handshake with %s: %w", nc.RemoteAddr(), err)
		}
		if err := checkHello(hello); err != nil {
			return fmt.Errorf("wire: %w: hello from %s: %s", authframe.ErrRefused, nc.RemoteAddr(), err)
		}
		if accept != nil {
			if err := accept(hello); err != nil {
				return fmt.Errorf("wire: %w: hello from %s (rank %d, world %d): %w", authframe.ErrRefused, nc.RemoteAddr(), hello.Rank, hello.World, err)
			}
		}
		n, err := newNonce()
		if err != nil {
			return err
		}
		ab = encodeAck(hb[:], n, keys.k.Handshake())
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
	return newConn(nc, keys, hello, hb[:], ab[:ackCore], dirToRank, o), hello, nil
}
