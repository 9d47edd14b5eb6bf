package authframe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
)

// A MAC tags or verifies the frames of one direction of one connection, in
// order. The tag of the direction's n-th frame (n from 0) is the first
// TagSize bytes of HMAC-SHA256(key, n u64 little-endian | header | payload).
// n is never sent: both ends count, so a frame replayed, dropped or
// reordered is checked at the wrong n and fails.
//
// Per frame: Begin with the header bytes the protocol covers, Write the
// payload (in as many pieces as it streams in), then Seal (writer) or Verify
// (reader). A MAC is not safe for concurrent use: the goroutine that owns a
// socket's writes owns its sending MAC, the one Receive at a time owns the
// other.
type MAC struct {
	h   hash.Hash
	seq uint64
	sum []byte
}

// NewMAC returns a MAC at sequence number 0 under key (a connection key).
func NewMAC(key []byte) *MAC {
	return &MAC{h: hmac.New(sha256.New, key), sum: make([]byte, 0, sha256.Size)}
}

// Seq is the sequence number of the next frame.
func (m *MAC) Seq() uint64 { return m.seq }

// Begin starts the next frame's tag over header.
func (m *MAC) Begin(header []byte) {
	var seq [8]byte
	binary.LittleEndian.PutUint64(seq[:], m.seq)
	m.h.Reset()
	m.h.Write(seq[:])
	m.h.Write(header)
}

// Write adds payload bytes to the frame begun. It never fails.
func (m *MAC) Write(p []byte) (int, error) { return m.h.Write(p) }

// Seal returns the tag of the frame begun and moves on to the next sequence
// number. The tag is valid until the next Begin.
func (m *MAC) Seal() []byte {
	m.sum = m.h.Sum(m.sum[:0])
	m.seq++
	return m.sum[:TagSize]
}

// Verify checks, in constant time, that tag is the frame begun's tag. On a
// match it moves on to the next sequence number; otherwise it returns an
// error wrapping ErrBadTag that names the sequence number, and the stream is
// out of step for good.
func (m *MAC) Verify(tag []byte) error {
	m.sum = m.h.Sum(m.sum[:0])
	if !hmac.Equal(m.sum[:TagSize], tag) {
		return fmt.Errorf("%w: tag of frame %d does not verify (another key, or a tampered, replayed, dropped, reordered or reflected frame)",
			ErrBadTag, m.seq)
	}
	m.seq++
	return nil
}
