package reduce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cohortdl/cohort/shared/authframe"
)

var le = binary.LittleEndian

// Wire is the element encoding of the host leaders' ring (averaging-cpu's
// internal/ring).
type Wire uint32

const (
	// WireF32 sends IEEE float32 values.
	WireF32 Wire = 1
	// WireBF16 sends bfloat16 values (rounded to nearest even); sums stay
	// f32.
	WireBF16 Wire = 2
)

// Size is the bytes of one element, 0 for an unknown encoding.
func (w Wire) Size() uint64 {
	switch w {
	case WireF32:
		return 4
	case WireBF16:
		return 2
	}
	return 0
}

func (w Wire) String() string {
	switch w {
	case WireF32:
		return "f32"
	case WireBF16:
		return "bf16"
	}
	return fmt.Sprintf("wire(%d)", uint32(w))
}

// Hello is what a rank says about itself when it connects.
type Hello struct {
	Rank  uint32
	World uint32
	Wire  Wire
	// Params and Buffers count the f32 elements the rank reduces with the
	// step weight and with the mover weight.
	Params, Buffers uint64
	// Run, Layout and Settings must be equal across the cohort.
	Run      [16]byte
	Layout   [32]byte
	Settings [16]byte
	// Host names the shared-memory domain of the rank: ranks with equal
	// Host fold through shared memory.
	Host [16]byte
}

// Elements is Params+Buffers.
func (h Hello) Elements() uint64 { return h.Params + h.Buffers }

// Check refuses a hello that names no valid rank or geometry.
func (h Hello) Check() error {
	if h.World == 0 || h.Rank >= h.World {
		return fmt.Errorf("rank %d out of range for world size %d", h.Rank, h.World)
	}
	if h.Wire.Size() == 0 {
		return fmt.Errorf("unknown wire encoding %d", uint32(h.Wire))
	}
	if h.Params > MaxElements || h.Buffers > MaxElements-h.Params {
		return fmt.Errorf("%d parameter and %d buffer elements exceed the limit of %d", h.Params, h.Buffers, uint64(MaxElements))
	}
	return nil
}

func encodeHello(h Hello, nonce [16]byte, hk []byte) [HelloSize]byte {
	var b [HelloSize]byte
	le.PutUint32(b[0:], HelloMagic)
	le.PutUint32(b[4:], Version)
	le.PutUint32(b[8:], h.Rank)
	le.PutUint32(b[12:], h.World)
	le.PutUint32(b[16:], uint32(h.Wire))
	le.PutUint32(b[20:], 0)
	le.PutUint64(b[24:], h.Params)
	le.PutUint64(b[32:], h.Buffers)
	copy(b[40:56], h.Run[:])
	copy(b[56:88], h.Layout[:])
	copy(b[88:104], h.Settings[:])
	copy(b[104:120], h.Host[:])
	copy(b[120:136], nonce[:])
	copy(b[136:144], authframe.Tag(hk, b[:136]))
	return b
}

// DecodeHello checks a hello's length, magic, version, tag and reserved
// bits, in that order, and decodes it. It does not judge the values (see
// Hello.Check).
func DecodeHello(b []byte, k Keys) (Hello, error) {
	if !k.k.Valid() {
		return Hello{}, errZeroKeys
	}
	if len(b) != HelloSize {
		return Hello{}, fmt.Errorf("%w: hello is %d bytes, want %d", authframe.ErrTruncated, len(b), HelloSize)
	}
	if m := le.Uint32(b[0:]); m != HelloMagic {
		return Hello{}, fmt.Errorf("%w: hello magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, m, HelloMagic)
	}
	if v := le.Uint32(b[4:]); v != Version {
		return Hello{}, fmt.Errorf("%w: hello version %d, want %d", authframe.ErrBadVersion, v, Version)
	}
	if !authframe.TagOK(k.k.Handshake(), b[136:144], b[:136]) {
		return Hello{}, fmt.Errorf("%w: hello tag does not verify (the rank holds another data key)", authframe.ErrBadTag)
	}
	if f := le.Uint32(b[20:]); f != 0 {
		return Hello{}, fmt.Errorf("%w: hello flags 0x%x, want 0", authframe.ErrMalformed, f)
	}
	h := Hello{
		Rank:    le.Uint32(b[8:]),
		World:   le.Uint32(b[12:]),
		Wire:    Wire(le.Uint32(b[16:])),
		Params:  le.Uint64(b[24:]),
		Buffers: le.Uint64(b[32:]),
	}
	copy(h.Run[:], b[40:56])
	copy(h.Layout[:], b[56:88])
	copy(h.Settings[:], b[88:104])
	copy(h.Host[:], b[104:120])
	return h, nil
}

// Status is the server's answer to a hello.
type Status uint32

// Answers. Accepted opens the connection; every other status refuses it.
const (
	Accepted Status = iota
	RefusedWorld
	RefusedRank
	RefusedDuplicate
	RefusedRun
	RefusedLayout
	RefusedSettings
	RefusedGeometry
	RefusedDead
	RefusedClosing
)

func (s Status) String() string {
	switch s {
	case Accepted:
		return "accepted"
	case RefusedWorld:
		return "world size differs from the server's"
	case RefusedRank:
		return "rank out of range"
	case RefusedDuplicate:
		return "rank already connected"
	case RefusedRun:
		return "belongs to another run"
	case RefusedLayout:
		return "parameter layout differs from the cohort's"
	case RefusedSettings:
		return "averaging settings (wire, gamma, outer optimizer) differ from the cohort's"
	case RefusedGeometry:
		return "element counts differ from the cohort's layout"
	case RefusedDead:
		return "rank was declared dead"
	case RefusedClosing:
		return "server is closing"
	}
	return fmt.Sprintf("refused (status %d)", uint32(s))
}

// A Refusal is the server's reason for refusing a hello.
type Refusal struct {
	Status Status
	Detail string
}

func (r *Refusal) Error() string {
	if r.Detail == "" {
		return r.Status.String()
	}
	return r.Status.String() + ": " + r.Detail
}

func encodeAck(status Status, nonce [16]byte, hello []byte, hk []byte) [AckSize]byte {
	var b [AckSize]byte
	le.PutUint32(b[0:], AckMagic)
	le.PutUint32(b[4:], Version)
	le.PutUint32(b[8:], uint32(status))
	le.PutUint32(b[12:], 0)
	copy(b[16:32], nonce[:])
	copy(b[32:40], authframe.Tag(hk, b[:32], hello))
	return b
}

// decodeAck verifies that ack answers hello and returns its status.
func decodeAck(ack, hello []byte, k Keys) (Status, error) {
	if len(ack) != AckSize {
		return 0, fmt.Errorf("%w: ack is %d bytes, want %d", authframe.ErrTruncated, len(ack), AckSize)
	}
	if m := le.Uint32(ack[0:]); m != AckMagic {
		return 0, fmt.Errorf("%w: ack magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, m, AckMagic)
	}
	if v := le.Uint32(ack[4:]); v != Version {
		return 0, fmt.Errorf("%w: ack version %d, want %d", authframe.ErrBadVersion, v, Version)
	}
	if !authframe.TagOK(k.k.Handshake(), ack[32:40], ack[:32], hello) {
		return 0, fmt.Errorf("%w: ack tag does not verify (the server holds another data key, or the ack answers another hello)", authframe.ErrBadTag)
	}
	if r := le.Uint32(ack[12:]); r != 0 {
		return 0, fmt.Errorf("%w: ack reserved field 0x%x, want 0", authframe.ErrMalformed, r)
	}
	return Status(le.Uint32(ack[8:])), nil
}

var errZeroKeys = errors.New("reduce: keys not derived (use DeriveKeys)")

// ClientHandshake runs the rank's side of the handshake on nc and returns
// the connection. The whole handshake is bounded by opts.Timeout (and ctx).
// A refusal is an error wrapping authframe.ErrRefused and a *Refusal; on any failure
// nc is closed.
func ClientHandshake(ctx context.Context, nc net.Conn, k Keys, h Hello, opts Options) (_ *Conn, err error) {
	opts = opts.withDefaults()
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if !k.k.Valid() {
		return nil, errZeroKeys
	}
	if err := h.Check(); err != nil {
		return nil, fmt.Errorf("reduce: refusing to send hello: %w", err)
	}
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("reduce: hello nonce: %w", err)
	}
	hb := encodeHello(h, nonce, k.k.Handshake())
	var ab [AckSize]byte
	var st Status
	err = authframe.SendHello(ctx, nc, opts.Timeout, hb[:], ab[:], "reduce",
		"the server closed the connection without answering (a wrong data key is never answered)",
		func() (err error) { st, err = decodeAck(ab[:], hb[:], k); return err })
	switch {
	case err != nil && st != Accepted:
		// A refusal outranks the failure to clear the deadline that follows
		// the server's hang-up.
	case err != nil:
		return nil, err
	}
	if st != Accepted {
		return nil, fmt.Errorf("reduce: %w: server %s refused rank %d: %w", authframe.ErrRefused, nc.RemoteAddr(), h.Rank, &Refusal{Status: st})
	}
	return newConn(nc, k, h, hb[:], ab[:32], ToServer, opts), nil
}

// ServerHandshake runs the server's side: it reads and verifies a hello,
// asks accept, and answers. A hello whose tag fails is not answered. When
// accept returns a *Refusal (or any error, answered as RefusedClosing), the
// refusal is answered, nc closed, and the error wraps authframe.ErrRefused; the Hello
// is returned for the log. Bounded by opts.Timeout and ctx.
func ServerHandshake(ctx context.Context, nc net.Conn, k Keys, accept func(Hello) error, opts Options) (_ *Conn, _ Hello, err error) {
	opts = opts.withDefaults()
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	if !k.k.Valid() {
		return nil, Hello{}, errZeroKeys
	}
	var (
		hb      [HelloSize]byte
		ab      [AckSize]byte
		h       Hello
		refused error // the answer to a hello that checked out but is refused
	)
	err = authframe.WithDeadline(ctx, nc, opts.Timeout, func() (err error) {
		if err = authframe.ReadHello(ctx, nc, hb[:], "reduce"); err != nil {
			return err
		}
		if h, err = DecodeHello(hb[:], k); err != nil {
			return fmt.Errorf("reduce: hello from %s: %w", nc.RemoteAddr(), err)
		}
		status := Accepted
		if err := h.Check(); err != nil {
			status, refused = RefusedRank, &Refusal{Status: RefusedRank, Detail: err.Error()}
		} else if accept != nil {
			if err := accept(h); err != nil {
				var r *Refusal
				if !errors.As(err, &r) {
					r = &Refusal{Status: RefusedClosing, Detail: err.Error()}
				}
				status, refused = r.Status, r
			}
		}
		var nonce [16]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return fmt.Errorf("reduce: ack nonce: %w", err)
		}
		ab = encodeAck(status, nonce, hb[:], k.k.Handshake())
		if _, err := nc.Write(ab[:]); err != nil {
			return fmt.Errorf("reduce: send ack to %s: %w", nc.RemoteAddr(), authframe.CtxCause(ctx, err))
		}
		return nil
	})
	if err != nil {
		return nil, Hello{}, err
	}
	if refused != nil {
		return nil, h, fmt.Errorf("reduce: %w: hello from %s (rank %d, world %d): %w", authframe.ErrRefused, nc.RemoteAddr(), h.Rank, h.World, refused)
	}
	return newConn(nc, k, h, hb[:], ab[:32], ToRank, opts), h, nil
}
