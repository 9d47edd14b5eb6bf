package authframe

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzReadPayload: whatever a peer declares and sends, ReadPayload never
// panics, refuses a length over the limit with ErrTooLarge, and otherwise
// returns exactly the declared bytes or ErrTruncated.
func FuzzReadPayload(f *testing.F) {
	f.Add(uint64(4), uint64(8), []byte("abcd"))
	f.Add(uint64(9), uint64(8), []byte("abcdefghi"))
	f.Add(uint64(1<<63), uint64(1<<20), []byte{})
	f.Add(uint64(10), uint64(1<<20), []byte("short"))
	f.Fuzz(func(t *testing.T, n, limit uint64, data []byte) {
		limit %= 1 << 20 // what a protocol may set; n stays wild
		got, err := ReadPayload(bytes.NewReader(data), n, limit)
		switch {
		case n > limit:
			if !errors.Is(err, ErrTooLarge) || got != nil {
				t.Fatalf("declared %d over limit %d: %d bytes, %v", n, limit, len(got), err)
			}
		case n > uint64(len(data)):
			if !errors.Is(err, ErrTruncated) || got != nil {
				t.Fatalf("declared %d, sent %d: %d bytes, %v", n, len(data), len(got), err)
			}
		default:
			if err != nil || !bytes.Equal(got, data[:n]) {
				t.Fatalf("declared %d, sent %d: %d bytes, %v", n, len(data), len(got), err)
			}
		}
	})
}

// FuzzVerify: a reader's MAC accepts a frame exactly when its tag is the
// one the writer's MAC sealed for that header and payload at that sequence
// number, and moves on only then.
func FuzzVerify(f *testing.F) {
	key := bytes.Repeat([]byte{0x42}, 32)
	good := seal(key, frame{[]byte("hdr"), []byte("pay")})[0]
	f.Add([]byte("hdr"), []byte("pay"), good, uint8(0))
	f.Add([]byte("hdr"), []byte("pay"), good, uint8(1))
	f.Add([]byte{}, []byte{}, []byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, header, payload, tag []byte, seq uint8) {
		w, r := NewMAC(key), NewMAC(key)
		for range seq % 4 { // both ends at the same sequence number
			w.Begin(nil)
			w.Seal()
			r.Begin(nil)
			if err := r.Verify(w.sum[:TagSize]); err != nil {
				t.Fatal(err)
			}
		}
		w.Begin(header)
		w.Write(payload)
		want := w.Seal()
		r.Begin(header)
		r.Write(payload)
		err := r.Verify(tag)
		if ok := bytes.Equal(tag, want); ok != (err == nil) {
			t.Fatalf("tag %x, sealed %x: Verify %v", tag, want, err)
		}
		if err != nil && !errors.Is(err, ErrBadTag) {
			t.Fatalf("refusal wraps no sentinel: %v", err)
		}
		if wantSeq := uint64(seq%4) + map[bool]uint64{true: 1}[err == nil]; r.Seq() != wantSeq {
			t.Fatalf("sequence %d after Verify (%v), want %d", r.Seq(), err, wantSeq)
		}
	})
}
