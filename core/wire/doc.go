// Package wire owns the control protocol's bytes: handshake, authenticated
// frames, message codec.
//
// A rank dials the coordinator over TCP and the two exchange a fixed-size
// handshake of four messages: the rank's 40-byte hello, the coordinator's
// 32-byte challenge, the rank's 16-byte proof and the coordinator's 16-byte
// ack. After it, every message travels as one frame: a 24-byte header
// followed by a protobuf payload from core/wire/wirepb/wire.proto. All
// integers are little-endian.
//
//	hello      magic u32 | version u32 | rank u32 | world u32 | nonce [16] | tag [8]
//	challenge  magic u32 | version u32 | nonce [16] | tag [8]
//	proof      magic u32 | version u32 | tag [8]
//	ack        magic u32 | version u32 | tag [8]
//	frame      magic u32 | version u32 | tag [8] | kind u32 | length u32 | payload
//
// With [WithTLS] (coordinator { tls } and worker { tls } in the config) the
// TCP connection is wrapped in mutual TLS 1.3 (shared/mtls) before the
// hello: the handshake and frames travel inside it unchanged, so the run's
// secret still authenticates the run, TLS its hosts.
//
// Each side draws its nonce from crypto/rand for every connection: the rank
// for its hello, the coordinator for its challenge. Every tag is the first
// 8 bytes of an HMAC-SHA256 under a key derived from the run's secret (see
// [DeriveKeys]; the derivation and the frame MAC are the
// authenticated-framing kernel's, shared/authframe). Each tagged message
// begins with its own magic, so no tag can stand in for another's:
//
//   - hello: over the hello's bytes [0:32], under the handshake key;
//   - challenge: over its bytes [0:24] followed by the 40 bytes of the hello
//     it answers, under the handshake key, so a recorded challenge answers
//     no other hello;
//   - proof: over its bytes [0:8], the hello and the challenge, under the
//     handshake key. Only a holder of the secret can compute it for a fresh
//     challenge, so a recorded hello, replayed in this run or another with
//     the same secret, ends here: the coordinator only now consults its
//     membership (a rank's slot is taken only by a proved hello) and a
//     replay is never acknowledged;
//   - ack: over its bytes [0:8], the hello, the challenge and the proof,
//     under the handshake key: the coordinator has taken the rank;
//   - frame: over an implicit sequence number (u64, 0 for a direction's first
//     frame after the handshake, +1 per frame, never sent) followed by kind,
//     length and payload, under the connection's key for that direction. The
//     connection's key for a direction is HMAC-SHA256(direction key, hello's
//     40 bytes | challenge's bytes [0:24]), which binds every frame to both
//     nonces of the handshake that opened its connection. A replayed,
//     dropped, reordered, reflected or spliced frame therefore fails
//     verification, and so does every frame recorded on an earlier
//     connection, of this run or of another run with the same secret.
//
// The hello's version is the rank's offer and every later message repeats
// it: a coordinator of another version refuses the hello at once
// (authframe.ErrBadVersion, logged with both versions), before it answers.
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
// reader's limit), ErrTruncated (the stream ended or stalled inside a
// handshake message or frame), ErrBadTag (another secret, a replayed hello's
// proof, or a tampered, replayed, dropped, reordered, reflected or spliced
// frame) and ErrRefused (the coordinator refused the proved hello).
package wire

import "github.com/cohortdl/cohort/shared/authframe"

// Protocol constants. The magic values are cohort's own, so a peer speaking
// any other protocol fails at the first four bytes instead of being misread.
const (
	// Version is the protocol version carried by every hello, ack and frame.
	// Version 3 added the challenge and proof: version 2 acknowledged a
	// hello before the rank had proved it was live, so a recorded hello
	// could hold a slot. The hello's version is the offer; a side that
	// speaks another refuses it (authframe.ErrBadVersion) before anything
	// else.
	Version uint32 = 3

	// HelloMagic opens a hello, ChallengeMagic a challenge, ProofMagic a
	// proof, AckMagic an ack, FrameMagic a frame.
	HelloMagic     uint32 = 0xC04E7001
	ChallengeMagic uint32 = 0xC04E7002
	FrameMagic     uint32 = 0xC04E7003
	ProofMagic     uint32 = 0xC04E7004
	AckMagic       uint32 = 0xC04E7005

	// MaxControlPayload is the largest payload a frame may carry, and the
	// default limit of every reader.
	MaxControlPayload = 16 << 20

	// MinSecretLen is the shortest secret DeriveKeys accepts.
	MinSecretLen = 16
)

const (
	nonceSize     = 16
	helloSize     = 40
	challengeSize = 32
	challengeCore = 24 // the challenge's bytes before its tag
	sealSize      = 16 // a proof or an ack
	headerSize    = 24
	tagSize       = authframe.TagSize

	// Kinds below kindRankBase flow coordinator -> rank; the others rank ->
	// coordinator.
	kindRankBase = 64
)
