// Package wire owns the control protocol's bytes: handshake, authenticated
// frames, message codec.
//
// A rank dials the coordinator over TCP and the two exchange a fixed-size
// handshake (a 40-byte hello, a 32-byte ack). After it, every message travels
// as one frame: a 24-byte header followed by a protobuf payload from
// core/wire/wirepb/wire.proto. All integers are little-endian.
//
//	hello  magic u32 | version u32 | rank u32 | world u32 | nonce [16] | tag [8]
//	ack    magic u32 | version u32 | nonce [16] | tag [8]
//	frame  magic u32 | version u32 | tag [8] | kind u32 | length u32 | payload
//
// With [WithTLS] (coordinator { tls } and worker { tls } in the config) the
// TCP connection is wrapped in mutual TLS 1.3 (shared/mtls) before the
// hello: the hello, ack and frames travel inside it unchanged, so the run's
// secret still authenticates the run, TLS its hosts.
//
// Each side draws its nonce from crypto/rand for every connection: the rank
// for its hello, the coordinator for its ack. Every tag is the first 8 bytes
// of an HMAC-SHA256 under a key derived from the run's secret (see
// [DeriveKeys]; the derivation and the frame MAC are the
// authenticated-framing kernel's, shared/authframe):
//
//   - hello: over the hello's bytes [0:32], under the handshake key;
//   - ack: over the ack's bytes [0:24] followed by the 40 bytes of the hello
//     it answers, under the handshake key, so a recorded ack answers no other
//     hello;
//   - frame: over an implicit sequence number (u64, 0 for a direction's first
//     frame after the handshake, +1 per frame, never sent) followed by kind,
//     length and payload, under the connection's key for that direction. The
//     connection's key for a direction is HMAC-SHA256(direction key, hello's
//     40 bytes | ack's bytes [0:24]), which binds every frame to both nonces
//     of the handshake that opened its connection. A replayed, dropped,
//     reordered, reflected or spliced frame therefore fails verification, and
//     so does every frame recorded on an earlier connection, of this run or
//     of another run with the same secret: a replayed hello may pass the
//     coordinator's checks (a hello carries no time), but the fresh nonce of
//     the coordinator's ack gives the connection keys no recording has used.
//
// A reader checks a frame's magic, version, kind (known, and flowing in the
// reader's direction: kinds below 64 flow coordinator to rank, the others
// rank to coordinator), and length (at most [MaxControlPayload]) before it
// allocates anything, then reads the payload and verifies the tag; only a
// verified payload is decoded. Each refusal wraps exactly one of the
// sentinel errors of shared/authframe, which the averager's data channel
// shares, so callers test with errors.Is(err, authframe.ErrBadTag) whichever
// protocol failed: ErrBadMagic and ErrBadVersion (a peer that is not a
// cohort control peer of this version), ErrUnknownKind (a kind not in
// wire.proto, or flowing the other way), ErrTooLarge (a length over the
// reader's limit), ErrTruncated (the stream ended or stalled inside a hello,
// ack or frame), ErrBadTag (another secret, or a tampered, replayed, dropped,
// reordered, reflected or spliced frame) and ErrRefused (the coordinator
// refused the hello).
package wire

import "github.com/cohortdl/cohort/shared/authframe"

// Protocol constants. The magic values are cohort's own, so a peer speaking
// any other protocol fails at the first four bytes instead of being misread.
const (
	// Version is the protocol version carried by every hello, ack and frame.
	Version uint32 = 2

	// HelloMagic opens a hello, AckMagic an ack, FrameMagic a frame.
	HelloMagic uint32 = 0xC04E7001
	AckMagic   uint32 = 0xC04E7002
	FrameMagic uint32 = 0xC04E7003

	// MaxControlPayload is the largest payload a frame may carry, and the
	// default limit of every reader.
	MaxControlPayload = 16 << 20

	// MinSecretLen is the shortest secret DeriveKeys accepts.
	MinSecretLen = 16
)

const (
	nonceSize  = 16
	helloSize  = 40
	ackSize    = 32
	ackCore    = 24 // the ack's bytes before its tag
	headerSize = 24
	tagSize    = authframe.TagSize

	// Kinds below kindRankBase flow coordinator -> rank; the others rank ->
	// coordinator.
	kindRankBase = 64
)
