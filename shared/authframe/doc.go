// Package authframe is the authenticated-framing kernel that cohort's two
// HMAC-framed TCP protocols share: the control protocol (core/wire, between
// the coordinator and its ranks) and the CPU averager's data channel
// (shared/reduce, between each rank's averaging plugin and the reduce
// server). A fix to how either authenticates its bytes is made here, once.
// It lives in the SDK because shared/reduce speaks it; an averager uses
// shared/reduce, not this package.
//
// It owns what the protocols have in common:
//
//   - key derivation from a run's secret (keys.go): one key per purpose under
//     a fixed label, one key per frame direction, connection keys bound to
//     the handshake that opened the connection, and keys for other purposes
//     under a label prefix no protocol key can reach;
//   - the sequence-numbered frame MAC (mac.go): the tag of a direction's
//     n-th frame is HMAC-SHA256(connection key, n u64 | header | payload)
//     cut to [TagSize] bytes, n never sent, so a replayed, dropped,
//     reordered, reflected or spliced frame fails;
//   - bounded payload reads (payload.go): a declared length over the limit
//     is refused before anything is allocated, and a length within it
//     allocates as bytes arrive;
//   - deadline helpers (deadline.go): ctx and a timeout bound each blocking
//     socket operation, and a ctx that ends interrupts it;
//   - the sentinel errors below, which both protocols re-export under their
//     own names.
//
// Each protocol keeps its own hello, ack, frame header, message kinds and
// codec on top: which header bytes a tag covers and where it travels are
// theirs (see core/wire/doc.go and shared/reduce/doc.go).
package authframe

import "errors"

// TagSize is the bytes of every tag on the wire: hello, ack and frame tags
// are the first TagSize bytes of an HMAC-SHA256.
const TagSize = 8

// Sentinel errors. Every refusal of bytes read from a peer wraps exactly one
// of them; the message around it says what was seen, and the protocol that
// saw it adds its name and the peer.
var (
	// ErrBadMagic: the first four bytes of a hello, ack or frame are not the
	// protocol's magic.
	ErrBadMagic = errors.New("bad magic")
	// ErrBadVersion: the peer speaks another protocol version.
	ErrBadVersion = errors.New("unsupported version")
	// ErrUnknownKind: a frame kind the protocol does not have, or one that
	// flows the other way.
	ErrUnknownKind = errors.New("unknown frame kind")
	// ErrTooLarge: a declared length over the reader's limit.
	ErrTooLarge = errors.New("declared size over the limit")
	// ErrTruncated: the stream ended or stalled inside a hello, ack or
	// frame.
	ErrTruncated = errors.New("truncated")
	// ErrBadTag: a tag that does not verify (another key, tampered bytes,
	// or a replayed, dropped, reordered, reflected or spliced frame).
	ErrBadTag = errors.New("authentication failed")
	// ErrMalformed: bytes that verified but break the protocol's rules (a
	// reserved field set, a payload that does not parse).
	ErrMalformed = errors.New("malformed message")
	// ErrRefused: the accepting end refused a hello.
	ErrRefused = errors.New("handshake refused")
)
