package authframe

import (
	"bytes"
	"errors"
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
	b.Run("gmac", func(b *testing.B) {
		g, _ := NewGMAC(key)
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			g.Seal(p)
		}
	})
}
