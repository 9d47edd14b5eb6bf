// Package reduce owns the bytes of the CPU averaging data channel: the TCP
// connection from each rank's averaging plugin (plugins/averaging-cpu) to
// the reduce server (core/reduceserver), which orchestrates membership and
// rounds; the host leaders sum their hosts' folds among themselves, over a
// ring of the averager's own (averaging-cpu's is its internal/ring). It
// holds the key schedule's labels, the handshake, the frame layout and the codec of every message. The key
// derivation, the sequence-numbered frame MAC, the deadline helpers and the
// sentinel errors are the authenticated-framing kernel's (shared/authframe),
// shared with the control protocol. The arithmetic both ends run (weights,
// bf16, the reduce kernels, the outer optimizers) lives in reduce/numeric.
//
// All integers are little-endian. A rank opens a connection with a 144-byte
// hello; the server answers with a 32-byte challenge, the rank with a
// 16-byte proof, and the server closes the handshake with a 24-byte ack:
//
//	hello      magic u32 | version u32 | rank u32 | world u32 | wire u32 | flags u32 |
//	           params u64 | buffers u64 | run [16] | layout [32] | settings [16] |
//	           host [16] | nonce [16] | tag [8]
//	challenge  magic u32 | version u32 | nonce [16] | tag [8]
//	proof      magic u32 | version u32 | tag [8]
//	ack        magic u32 | version u32 | status u32 | reserved u32 | tag [8]
//
// params and buffers count the f32 elements the rank reduces (equal across
// the cohort); run, layout and settings are digests that must match
// across the cohort; host names the shared-memory domain the rank lives in;
// the two nonces (the rank's in its hello, the server's in its challenge)
// make every connection's keys unique. Every tag is the first 8 bytes of an
// HMAC-SHA256 under the handshake key, and each message begins with its own
// magic, so no tag stands in for another's:
//
//   - hello: over its first 136 bytes;
//   - challenge: over its first 24 bytes and the whole hello, so a recorded
//     challenge answers no other hello;
//   - proof: over its first 8 bytes, the hello and the challenge. Only a
//     holder of the data key can compute it for a fresh challenge, so a
//     recorded hello, replayed into this run or a later one with the same
//     key, ends here: the server judges a hello (its membership: a rank's
//     slot, a dead rank, the cohort's geometry) only once its proof
//     verifies, and a replay is never acknowledged and never holds a slot;
//   - ack: over its first 16 bytes, the hello, the challenge and the proof,
//     so an ack closes exactly one handshake.
//
// A hello or proof whose tag fails is never answered. A proved hello the
// server refuses (wrong world, run, layout or settings, a rank out of range,
// already present or declared dead) is answered with an ack whose status
// says why, so the rank can log the reason.
//
// The hello's version is the rank's offer and every later message repeats
// it: a server of another version refuses the hello before it answers
// (authframe.ErrBadVersion, logged with both versions), and the rank reads a
// hang-up. Version 2, whose server acknowledged a hello before the rank
// proved it live, and version 3 refuse each other.
//
// After the handshake every message is one frame:
//
//	frame  magic u32 | kind u16 | flags u16 | length u64 | payload | tag [8]
//
// The tag is the first 8 bytes of HMAC-SHA256, under the connection's key
// for the frame's direction, over an implicit sequence number (u64, 0 for a
// direction's first frame, never sent), the 16-byte header and the payload.
// A connection's key for a direction is HMAC-SHA256(direction key, hello |
// challenge[0:24]): frames are bound to both nonces of the handshake that
// opened their connection, and a replayed, dropped, reordered, reflected or spliced frame
// fails. The tag trails the payload so a large frame streams out while it is
// hashed.
//
// A reader checks magic, flags, kind (known, and flowing its way) and length
// (at most MaxControlPayload) before it reads or allocates anything, and
// returns nothing until the tag verifies. Every read has a deadline. One goroutine owns each socket's
// writes. Every refusal wraps exactly one of the sentinel errors of
// shared/authframe (the control protocol's too): ErrMalformed, on this
// channel, means bytes that verified but break a rule of codec.go or the
// handshake (a reserved field set, a payload that does not parse).
//
// Where is: keys.go the key schedule's labels; handshake.go the hello, ack
// and both handshakes; conn.go the Conn and its lifetime, send.go its writer
// goroutine, receive.go its reader; kind.go the frame kinds; msg.go the
// messages and codec.go their bytes.
package reduce

import "github.com/cohortdl/cohort/shared/authframe"

// Protocol constants. The magic values are cohort's own, distinct from the
// control protocol's, so a peer dialling the wrong port fails at once.
const (
	// Version 3 added the challenge and the proof: version 2 acknowledged
	// a hello before the rank had proved it live, so a recorded hello
	// could be acknowledged and hold a rank's slot.
	Version uint32 = 3

	HelloMagic     uint32 = 0xC04ED001
	AckMagic       uint32 = 0xC04ED002
	FrameMagic     uint32 = 0xC04ED003
	ChallengeMagic uint32 = 0xC04ED004
	ProofMagic     uint32 = 0xC04ED005

	// HelloSize, ChallengeSize, ProofSize and AckSize are the handshake's
	// fixed sizes.
	HelloSize     = 144
	ChallengeSize = 32
	ProofSize     = 16
	AckSize       = 24

	// MaxControlPayload bounds the payload of every frame.
	MaxControlPayload = 1 << 20

	// MaxElements bounds the f32 elements a hello may declare: the arena's
	// own limit in 4-byte elements.
	MaxElements = 1 << 38

	// MinKeyLen is the shortest data key DeriveKeys accepts.
	MinKeyLen = 16

	headerSize = 16
	tagSize    = authframe.TagSize
	// challengeCore is the challenge less its tag: with the hello, what a
	// connection's keys are bound to.
	challengeCore = 24
)
