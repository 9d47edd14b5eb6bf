package reduce

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	// WireBF16 sends bfloat16 values (rounded to nearest even): the
	// parameters as their change since the previous round's global
	// parameters, with what rounding drops carried to the next round
	// (reduce/numeric/delta.go), buffers as they are. Its code
	// is 3: code 2 was bf16 of the parameters themselves, which the two
	// ends cannot mix, so a rank of either encoding is refused by a
	// server of the other (an unknown wire), and code 2 is not reused.
	WireBF16 Wire = 3
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
		return Hello{}, fmt.Errorf("%w: hello version %d, this side speaks %d (run one cohort release on every host)", authframe.ErrBadVersion, v, Version)
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

// encodeChallenge returns the server's challenge answering hello with its
// nonce: tagged over its own first 24 bytes and the whole hello, so a
// recorded challenge answers no other hello.
func encodeChallenge(hello []byte, nonce [16]byte, hk []byte) [ChallengeSize]byte {
	var b [ChallengeSize]byte
	le.PutUint32(b[0:], ChallengeMagic)
	le.PutUint32(b[4:], Version)
	copy(b[8:24], nonce[:])
	copy(b[24:32], authframe.Tag(hk, b[:24], hello))
	return b
}

// verifyChallenge checks that ch is the server's answer to hello: length,
// magic, version, tag.
func verifyChallenge(ch, hello []byte, k Keys) error {
	if len(ch) != ChallengeSize {
		return fmt.Errorf("%w: challenge is %d bytes, want %d", authframe.ErrTruncated, len(ch), ChallengeSize)
	}
	if err := checkHead(ch, ChallengeMagic, "challenge"); err != nil {
		return err
	}
	if !authframe.TagOK(k.k.Handshake(), ch[24:32], ch[:24], hello) {
		return fmt.Errorf("%w: challenge tag does not verify (the server holds another data key, or the challenge answers another hello)", authframe.ErrBadTag)
	}
	return nil
}

// encodeProof returns the rank's answer to a challenge: only a holder of
// the data key can tag the hello and this fresh challenge together.
func encodeProof(hello, challenge []byte, hk []byte) [ProofSize]byte {
	var b [ProofSize]byte
	le.PutUint32(b[0:], ProofMagic)
	le.PutUint32(b[4:], Version)
	copy(b[8:16], authframe.Tag(hk, b[:8], hello, challenge))
	return b
}

// verifyProof checks a rank's proof against the hello and the challenge
// of this connection.
func verifyProof(p, hello, challenge []byte, k Keys) error {
	if len(p) != ProofSize {
		return fmt.Errorf("%w: proof is %d bytes, want %d", authframe.ErrTruncated, len(p), ProofSize)
	}
	if err := checkHead(p, ProofMagic, "proof"); err != nil {
		return err
	}
	if !authframe.TagOK(k.k.Handshake(), p[8:16], p[:8], hello, challenge) {
		return fmt.Errorf("%w: proof tag does not verify (another data key, or a proof recorded on another connection: a replayed hello)", authframe.ErrBadTag)
	}
	return nil
}

// encodeAck returns the server's verdict on a proved hello, tagged over
// its first 16 bytes and the whole handshake before it.
func encodeAck(status Status, hello, challenge, proof []byte, hk []byte) [AckSize]byte {
	var b [AckSize]byte
	le.PutUint32(b[0:], AckMagic)
	le.PutUint32(b[4:], Version)
	le.PutUint32(b[8:], uint32(status))
	le.PutUint32(b[12:], 0)
	copy(b[16:24], authframe.Tag(hk, b[:16], hello, challenge, proof))
	return b
}

// decodeAck verifies that ack closes this connection's handshake and
// returns its status.
func decodeAck(ack, hello, challenge, proof []byte, k Keys) (Status, error) {
	if len(ack) != AckSize {
		return 0, fmt.Errorf("%w: ack is %d bytes, want %d", authframe.ErrTruncated, len(ack), AckSize)
	}
	if err := checkHead(ack, AckMagic, "ack"); err != nil {
		return 0, err
	}
	if !authframe.TagOK(k.k.Handshake(), ack[16:24], ack[:16], hello, challenge, proof) {
		return 0, fmt.Errorf("%w: ack tag does not verify (the server holds another data key, or the ack closes another handshake)", authframe.ErrBadTag)
	}
	if r := le.Uint32(ack[12:]); r != 0 {
		return 0, fmt.Errorf("%w: ack reserved field 0x%x, want 0", authframe.ErrMalformed, r)
	}
	return Status(le.Uint32(ack[8:])), nil
}

// checkHead checks the magic and version that open every handshake
// message after the hello.
func checkHead(b []byte, magic uint32, what string) error {
	if m := le.Uint32(b[0:]); m != magic {
		return fmt.Errorf("%w: %s magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, what, m, magic)
	}
	if v := le.Uint32(b[4:]); v != Version {
		return fmt.Errorf("%w: %s version %d, want %d", authframe.ErrBadVersion, what, v, Version)
	}
	return nil
}

// exchange writes out and reads exactly len(in) bytes of answer (named
// what); hangUp says what the peer closing without a full answer means.
func exchange(ctx context.Context, nc net.Conn, out, in []byte, what, hangUp string) error {
	if _, err := nc.Write(out); err != nil {
		return fmt.Errorf("reduce: send to %s before its %s: %w", nc.RemoteAddr(), what, authframe.CtxCause(ctx, err))
	}
	if n, err := io.ReadFull(nc, in); err != nil {
		if authframe.IsEOF(err) {
			return fmt.Errorf("reduce: %w: %s from %s: got %d of %d bytes; %s: %w",
				authframe.ErrTruncated, what, nc.RemoteAddr(), n, len(in), hangUp, err)
		}
		return fmt.Errorf("reduce: read %s from %s: got %d of %d bytes: %w", what, nc.RemoteAddr(), n, len(in), authframe.CtxCause(ctx, err))
	}
	return nil
}

var errZeroKeys = errors.New("reduce: keys not derived (use DeriveKeys)")

// ClientHandshake runs the rank's side of the handshake on nc: it sends
// the hello, verifies the server's challenge, answers it with its proof and
// reads the server's verdict. The whole handshake is bounded by
// opts.Timeout (and ctx). A refusal is an error wrapping
// authframe.ErrRefused and a *Refusal; on any failure nc is closed.
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
	hk := k.k.Handshake()
	hb := encodeHello(h, nonce, hk)
	var (
		cb [ChallengeSize]byte
		ab [AckSize]byte
		st Status
	)
	err = authframe.WithDeadline(ctx, nc, opts.Timeout, func() error {
		if err := exchange(ctx, nc, hb[:], cb[:], "challenge",
			"the server closed the connection without a challenge: a wrong data key is never answered, nor a hello of another protocol version"); err != nil {
			return err
		}
		if err := verifyChallenge(cb[:], hb[:], k); err != nil {
			return fmt.Errorf("reduce: handshake with %s: %w", nc.RemoteAddr(), err)
		}
		proof := encodeProof(hb[:], cb[:], hk)
		if err := exchange(ctx, nc, proof[:], ab[:], "ack", "the server closed the connection without its verdict"); err != nil {
			return err
		}
		var err error
		if st, err = decodeAck(ab[:], hb[:], cb[:], proof[:], k); err != nil {
			return fmt.Errorf("reduce: handshake with %s: %w", nc.RemoteAddr(), err)
		}
		return nil
	})
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
	return newConn(nc, k, h, hb[:], cb[:challengeCore], ToServer, opts), nil
}

// ServerHandshake runs the server's side: it reads and verifies a hello,
// answers it with a challenge carrying a fresh nonce, reads and verifies
// the rank's proof, and only then judges the hello (Hello.Check, then
// accept) and answers with its verdict. A recorded hello replayed here
// draws a challenge it cannot answer: it never reaches accept, so it holds
// no rank's slot, and it is never acknowledged. A hello or proof whose tag
// fails is not answered. When accept returns a *Refusal (or any error,
// answered as RefusedClosing), the refusal is answered, nc closed, and the
// error wraps authframe.ErrRefused; the Hello is returned for the log.
// Bounded by opts.Timeout and ctx.
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
	hk := k.k.Handshake()
	var (
		hb      [HelloSize]byte
		cb      [ChallengeSize]byte
		h       Hello
		refused error // the answer to a proved hello that is refused
	)
	err = authframe.WithDeadline(ctx, nc, opts.Timeout, func() (err error) {
		if err = authframe.ReadHello(ctx, nc, hb[:], "reduce"); err != nil {
			return err
		}
		if h, err = DecodeHello(hb[:], k); err != nil {
			return fmt.Errorf("reduce: hello from %s: %w", nc.RemoteAddr(), err)
		}
		var nonce [16]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return fmt.Errorf("reduce: challenge nonce: %w", err)
		}
		cb = encodeChallenge(hb[:], nonce, hk)
		var pb [ProofSize]byte
		if err := exchange(ctx, nc, cb[:], pb[:], "proof", "the peer sent a hello it cannot prove (a replayed hello)"); err != nil {
			return err
		}
		if err := verifyProof(pb[:], hb[:], cb[:], k); err != nil {
			return fmt.Errorf("reduce: handshake with %s (hello of rank %d): %w", nc.RemoteAddr(), h.Rank, err)
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
		ab := encodeAck(status, hb[:], cb[:], pb[:], hk)
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
	return newConn(nc, k, h, hb[:], cb[:challengeCore], ToRank, opts), h, nil
}
