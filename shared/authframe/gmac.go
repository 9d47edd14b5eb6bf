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
	aead  cipher.AEAD
	block cipher.Block
	gh    ghasher // nil: aead computes the tags
	seq   uint64
	tag   []byte
}

// A ghasher is GCM's GHASH under one key, for data as additional data and
// no ciphertext; set up by a build that has a faster one than
// crypto/cipher's (ghash_simd.go).
type ghasher interface {
	sum(data []byte) [16]byte
}

// newGHash, when set, returns a ghasher for the hash key h = E_K(0¹²⁸).
var newGHash func(h [16]byte) ghasher

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
	g := &GMAC{aead: a, block: b, tag: make([]byte, 0, GMACTagSize)}
	if newGHash != nil {
		var h [16]byte
		b.Encrypt(h[:], h[:])
		g.gh = newGHash(h)
	}
	return g, nil
}

// Seq is the sequence number of the next frame.
func (g *GMAC) Seq() uint64 { return g.seq }

func (g *GMAC) sum(payload []byte) []byte {
	var nonce [12]byte
	binary.LittleEndian.PutUint64(nonce[:], g.seq)
	if g.gh == nil {
		g.tag = g.aead.Seal(g.tag[:0], nonce[:], nil, payload)
		return g.tag
	}
	// GCM's tag: GHASH xor E_K(J0), J0 the 96-bit nonce | 0³¹1.
	var j0 [16]byte
	copy(j0[:], nonce[:])
	j0[15] = 1
	g.block.Encrypt(j0[:], j0[:])
	s := g.gh.sum(payload)
	g.tag = g.tag[:GMACTagSize]
	subtle.XORBytes(g.tag, s[:], j0[:])
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
