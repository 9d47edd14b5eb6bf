package authframe

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

func TestGMAC(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	frames := [][]byte{[]byte("first"), nil, bytes.Repeat([]byte{1}, 1<<16), []byte("last")}
	tamper := func(i int, b []byte) []byte {
		c := append([]byte(nil), b...)
		if len(c) == 0 {
			return []byte{0}
		}
		c[len(c)/2] ^= 1
		return c
	}
	cases := []struct {
		name string
		recv func(i int, b []byte) []byte // what the receiver sees as frame i
		key  []byte
		bad  int // first frame that must fail, -1 none
	}{
		{"in order", func(_ int, b []byte) []byte { return b }, key, -1},
		{"tampered", func(i int, b []byte) []byte {
			if i == 2 {
				return tamper(i, b)
			}
			return b
		}, key, 2},
		{"truncated", func(i int, b []byte) []byte {
			if i == 3 {
				return b[:len(b)-1]
			}
			return b
		}, key, 3},
		{"reordered", func(i int, b []byte) []byte {
			if i == 0 {
				return frames[3]
			}
			return b
		}, key, 0},
		{"other key", func(_ int, b []byte) []byte { return b }, bytes.Repeat([]byte{8}, 32), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewGMAC(key)
			if err != nil {
				t.Fatal(err)
			}
			r, err := NewGMAC(c.key)
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range frames {
				tag := append([]byte(nil), s.Seal(f)...)
				if len(tag) != GMACTagSize {
					t.Fatalf("tag of %d bytes", len(tag))
				}
				err := r.Verify(c.recv(i, f), tag)
				if i == c.bad {
					if !errors.Is(err, ErrBadTag) {
						t.Fatalf("frame %d: %v, want ErrBadTag", i, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
			}
			if c.bad >= 0 {
				t.Fatal("no frame failed")
			}
		})
	}
	if _, err := NewGMAC([]byte("short")); err == nil {
		t.Fatal("a 5-byte key was accepted")
	}
}

// TestGMACIsGCM: every tag is AES-GCM's over an empty plaintext with the
// payload as additional data, for each key size, at lengths around the
// block (16 B) and the wide GHASH's 512-byte run, and at a ring frame's
// sizes; so a build with the wide GHASH and one without agree on the wire.
func TestGMACIsGCM(t *testing.T) {
	t.Logf("wide GHASH: %v", newGHash != nil)
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{0, 1, 15, 16, 17, 31, 32, 100, 511, 512, 513, 1023, 1024, 1040, 4099, 1 << 16, 1<<18 + 5}
	for _, ks := range []int{16, 24, 32} {
		for _, n := range lengths {
			key, data := make([]byte, ks), make([]byte, n)
			fill(r, key)
			fill(r, data)
			checkGCM(t, key, data, 3)
		}
	}
	// The all-ones payload drives every carry and reduction step.
	checkGCM(t, bytes.Repeat([]byte{0xff}, 32), bytes.Repeat([]byte{0xff}, 4096+48), 2)
}

// FuzzGMACIsGCM: the same for any key and payload.
func FuzzGMACIsGCM(f *testing.F) {
	f.Add(bytes.Repeat([]byte{7}, 16), []byte("payload"))
	f.Add(bytes.Repeat([]byte{0xff}, 32), bytes.Repeat([]byte{0xff}, 700))
	f.Fuzz(func(t *testing.T, key, data []byte) {
		if len(key) != 16 && len(key) != 24 && len(key) != 32 {
			return
		}
		checkGCM(t, key, data, 2)
	})
}

// checkGCM compares frames GMAC tags of data under key with crypto/cipher's
// GCM at the same sequence numbers.
func checkGCM(t *testing.T, key, data []byte, frames int) {
	t.Helper()
	g, err := NewGMAC(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	for seq := range uint64(frames) {
		var nonce [12]byte
		binary.LittleEndian.PutUint64(nonce[:], seq)
		want := gcm.Seal(nil, nonce[:], nil, data)
		if got := g.Seal(data); !bytes.Equal(got, want) {
			t.Fatalf("%d-byte key, %d-byte payload, frame %d: tag %x, GCM's %x", len(key), len(data), seq, got, want)
		}
	}
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// BenchmarkTags compares the frame MACs over 1 MiB payloads.
func BenchmarkTags(b *testing.B) {
	p := make([]byte, 1<<20)
	key := bytes.Repeat([]byte{7}, 32)
	b.Run("hmac-sha256", func(b *testing.B) {
		m := NewMAC(key)
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			m.Begin(nil)
			m.Write(p)
			m.Seal()
		}
	})
	b.Run("gmac-crypto-cipher", func(b *testing.B) {
		g, _ := NewGMAC(key)
		g.gh = nil
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			g.Seal(p)
		}
	})
	b.Run("gmac", func(b *testing.B) {
		g, _ := NewGMAC(key)
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			g.Seal(p)
		}
	})
}
