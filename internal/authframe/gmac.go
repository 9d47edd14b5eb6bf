package authframe

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
)

// GMACTagSize is the bytes of a GMAC tag on the wire.
const GMACTagSize = 16

// A GMAC tags or verifies the bulk frames of one direction of one
// connection, in order, at the speed of AES-GCM rather than SHA-256: the
// tag of the direction's n-th frame is AES-GCM's tag over an empty
// plaintext with the frame's payload as additional data (GMAC), under the
// connection key and the nonce n u64 little-endian | 4 zero bytes. n is
// never sent, so a replayed, dropped or reordered frame fails, and GCM's
// length block binds the payload's length. Connection keys are unique per
// handshake and per direction, so a nonce never repeats under one key.
//
// A GMAC is not safe for concurrent use: one goroutine tags or verifies a
// direction's frames in sequence.
type GMAC struct {
	aead cipher.AEAD
	seq  uint64
	tag  []byte
}

// NewGMAC returns a GMAC at sequence number 0 under key, a 16-, 24- or
// 32-byte connection key.
func NewGMAC(key []byte) (*GMAC, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("gmac key: %w", err)
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		return nil, fmt.Errorf("gmac: %w", err)
	}
	return &GMAC{aead: a, tag: make([]byte, 0, GMACTagSize)}, nil
}

// Seq is the sequence number of the next frame.
func (g *GMAC) Seq() uint64 { return g.seq }

func (g *GMAC) sum(payload []byte) []byte {
	var nonce [12]byte
	binary.LittleEndian.PutUint64(nonce[:], g.seq)
	g.tag = g.aead.Seal(g.tag[:0], nonce[:], nil, payload)
	return g.tag
}

// Seal returns the tag of the next frame, whose payload is payload, and
// moves on to the next sequence number. The tag is valid until the next
// call.
func (g *GMAC) Seal(payload []byte) []byte {
	t := g.sum(payload)
	g.seq++
	return t
}

// Verify checks, in constant time, that tag is the next frame's tag over
// payload. On a match it moves on to the next sequence number; otherwise it
// returns an error wrapping ErrBadTag that names the sequence number, and
// the stream is out of step for good.
func (g *GMAC) Verify(payload, tag []byte) error {
	if subtle.ConstantTimeCompare(g.sum(payload), tag) != 1 {
		return fmt.Errorf("%w: tag of frame %d does not verify (another key, or a tampered, replayed, dropped or reordered frame)", ErrBadTag, g.seq)
	}
	g.seq++
	return nil
}
