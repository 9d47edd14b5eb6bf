package authframe

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

type frame struct{ header, payload []byte }

// seal tags frames in order under key, returning each frame's tag.
func seal(key []byte, frames ...frame) [][]byte {
	m := NewMAC(key)
	var tags [][]byte
	for _, f := range frames {
		m.Begin(f.header)
		m.Write(f.payload)
		tags = append(tags, append([]byte(nil), m.Seal()...))
	}
	return tags
}

// The tag is the documented HMAC, computed here independently, and it
// changes with the sequence number alone.
func TestMACTagIsSequenceNumberedHMAC(t *testing.T) {
	key := bytes.Repeat([]byte{0x5a}, 32)
	f := frame{[]byte("header"), []byte("payload")}
	tags := seal(key, f, f, f)
	for seq, tag := range tags {
		h := hmac.New(sha256.New, key)
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(seq)))
		h.Write(f.header)
		h.Write(f.payload)
		if want := h.Sum(nil)[:TagSize]; !bytes.Equal(tag, want) {
			t.Fatalf("frame %d tag %x, want %x", seq, tag, want)
		}
	}
	if bytes.Equal(tags[0], tags[1]) {
		t.Fatal("equal frames at sequence 0 and 1 carry the same tag")
	}
}

// A payload written in pieces tags like the same payload written at once,
// so a protocol may stream a large frame through the MAC.
func TestMACStreamsPayload(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	whole := seal(key, frame{[]byte("h"), []byte("abcdef")})[0]
	m := NewMAC(key)
	m.Begin([]byte("h"))
	for _, p := range []string{"ab", "", "cde", "f"} {
		m.Write([]byte(p))
	}
	if got := m.Seal(); !bytes.Equal(got, whole) {
		t.Fatalf("streamed tag %x, whole tag %x", got, whole)
	}
}

func TestMACVerify(t *testing.T) {
	key := bytes.Repeat([]byte{2}, 32)
	f0 := frame{[]byte{0, 1}, []byte("first")}
	f1 := frame{[]byte{0, 1}, []byte("second")}
	f2 := frame{[]byte{0, 1}, []byte("third")}
	tags := seal(key, f0, f1, f2)
	type got struct {
		f   frame
		tag []byte
	}
	for _, tc := range []struct {
		name   string
		key    []byte
		stream []got
		good   int // frames that verify before the failure; all when len(stream)
	}{
		{"in order", key, []got{{f0, tags[0]}, {f1, tags[1]}, {f2, tags[2]}}, 3},
		{"replayed", key, []got{{f0, tags[0]}, {f0, tags[0]}}, 1},
		{"dropped", key, []got{{f0, tags[0]}, {f2, tags[2]}}, 1},
		{"reordered", key, []got{{f1, tags[1]}, {f0, tags[0]}}, 0},
		{"other key", bytes.Repeat([]byte{3}, 32), []got{{f0, tags[0]}}, 0},
		{"header changed", key, []got{{frame{[]byte{0, 2}, f0.payload}, tags[0]}}, 0},
		{"payload changed", key, []got{{frame{f0.header, []byte("firsT")}, tags[0]}}, 0},
		// The MAC covers bytes, not their split: protocols keep headers
		// fixed-size so no two frames share a byte string.
		{"header byte moved into payload", key, []got{{frame{[]byte{0}, []byte("\x01first")}, tags[0]}}, 1},
		{"truncated tag", key, []got{{f0, tags[0][:4]}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMAC(tc.key)
			for i, g := range tc.stream {
				m.Begin(g.f.header)
				m.Write(g.f.payload)
				err := m.Verify(g.tag)
				if i < tc.good {
					if err != nil {
						t.Fatalf("frame %d: %v", i, err)
					}
					continue
				}
				if !errors.Is(err, ErrBadTag) || !strings.Contains(err.Error(), "frame "+string(rune('0'+i))) {
					t.Fatalf("frame %d: %v, want ErrBadTag naming the sequence number", i, err)
				}
				if m.Seq() != uint64(i) {
					t.Fatalf("a failed Verify moved the sequence number to %d", m.Seq())
				}
				return
			}
			if m.Seq() != uint64(len(tc.stream)) {
				t.Fatalf("sequence %d after %d good frames", m.Seq(), len(tc.stream))
			}
		})
	}
}
