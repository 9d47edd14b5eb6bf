package wire

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"google.golang.org/protobuf/proto"
)

// The frame's bytes follow the documented layout, and its tag is the HMAC of
// sequence | kind | length | payload, computed here independently.
func TestFrameLayout(t *testing.T) {
	key := bytes.Repeat([]byte{0x5a}, 32)
	msg := &wirepb.Heartbeat{Rank: 3, Counter: 1000}
	_, payload, _ := Encode(msg)
	frames := frameBytes(t, key, msg, msg)
	for seq, f := range frames {
		if len(f) != headerSize+len(payload) {
			t.Fatalf("frame %d is %d bytes, want %d", seq, len(f), headerSize+len(payload))
		}
		le := binary.LittleEndian
		if le.Uint32(f[0:]) != FrameMagic || le.Uint32(f[4:]) != Version ||
			le.Uint32(f[16:]) != uint32(wirepb.FrameKind_FRAME_KIND_HEARTBEAT) ||
			le.Uint32(f[20:]) != uint32(len(payload)) || !bytes.Equal(f[24:], payload) {
			t.Fatalf("frame %d header % x does not follow the layout", seq, f[:24])
		}
		m := hmac.New(sha256.New, key)
		var pre [16]byte
		le.PutUint64(pre[0:], uint64(seq))
		copy(pre[8:], f[16:24])
		m.Write(pre[:])
		m.Write(payload)
		if want := m.Sum(nil)[:8]; !bytes.Equal(f[8:16], want) {
			t.Fatalf("frame %d tag % x, want % x", seq, f[8:16], want)
		}
	}
	if bytes.Equal(frames[0][8:16], frames[1][8:16]) {
		t.Fatal("two frames with the same content carry the same tag: the sequence number is not covered")
	}
}

func TestReadFrameAccepts(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	msgs := []proto.Message{&wirepb.Heartbeat{Rank: 1, Counter: 1}, &wirepb.Exiting{}, &wirepb.Heartbeat{Rank: 1, Counter: 2}}
	src := bytes.NewReader(bytes.Join(frameBytes(t, key, msgs...), nil))
	r := &frameReader{mac: authframe.NewMAC(key), dir: dirToCoord, max: MaxControlPayload}
	for i, want := range msgs {
		kind, payload, err := r.readFrame(src)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		got, err := Decode(kind, payload)
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("frame %d: got %v (%v), want %v", i, got, err, want)
		}
	}
	// EOF between frames is clean.
	if _, _, err := r.readFrame(src); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReadFrameRejects(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	k := mustKeys(t, testSecret)
	hb := encodeHello(Hello{Rank: 0, World: 2}, testNonce(1), k.k.Handshake())
	ab := encodeChallenge(hb[:], testNonce(2), k.k.Handshake())
	hb1 := encodeHello(Hello{Rank: 1, World: 2}, testNonce(3), k.k.Handshake())
	ab1 := encodeChallenge(hb1[:], testNonce(4), k.k.Handshake())
	abAgain := encodeChallenge(hb[:], testNonce(5), k.k.Handshake())
	connToCoord := connKey(k, dirToCoord, hb[:], ab[:challengeCore])

	hbeat := func(n uint64) proto.Message { return &wirepb.Heartbeat{Rank: 1, Counter: n} }
	f := frameBytes(t, key, hbeat(0), hbeat(1), hbeat(2))
	mut := func(b []byte, fn func([]byte)) []byte {
		c := append([]byte(nil), b...)
		fn(c)
		return c
	}
	withKind := func(kind uint32) []byte {
		w := &frameWriter{mac: authframe.NewMAC(key)}
		return w.appendFrame(nil, wirepb.FrameKind(kind), []byte{8, 1})
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

	cases := []struct {
		name    string
		stream  []byte
		key     []byte // reader's key; default key
		max     uint32 // reader's limit; default MaxControlPayload
		good    int    // frames read before the failure
		want    error
		mention string // a value the error must quote
	}{
		{name: "wrong magic", stream: mut(f[0], func(b []byte) { binary.LittleEndian.PutUint32(b, 0x12345678) }), want: authframe.ErrBadMagic, mention: "0x12345678"},
		{name: "floDl magic", stream: mut(f[0], func(b []byte) { binary.LittleEndian.PutUint32(b, 0xF10D17C4) }), want: authframe.ErrBadMagic, mention: "0xf10d17c4"},
		{name: "wrong version", stream: mut(f[0], func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 6) }), want: authframe.ErrBadVersion, mention: "version 6"},
		{name: "unknown kind", stream: withKind(999), want: authframe.ErrUnknownKind, mention: "999"},
		{name: "unspecified kind", stream: withKind(0), want: authframe.ErrUnknownKind},
		{name: "unknown kind in rank range", stream: withKind(127), want: authframe.ErrUnknownKind, mention: "127"},
		{name: "wrong-direction kind", stream: withKind(uint32(wirepb.FrameKind_FRAME_KIND_SHUTDOWN)), want: authframe.ErrUnknownKind, mention: "FRAME_KIND_SHUTDOWN"},
		{name: "length over the limit", stream: f[0], max: uint32(len(f[0]) - headerSize - 1), want: authframe.ErrTooLarge, mention: "limit"},
		{name: "length over the default limit", stream: mut(f[0], func(b []byte) { binary.LittleEndian.PutUint32(b[20:], MaxControlPayload+1) }), want: authframe.ErrTooLarge, mention: "16777217"},
		{name: "truncated header", stream: f[0][:10], want: authframe.ErrTruncated},
		{name: "truncated after one byte", stream: f[0][:1], want: authframe.ErrTruncated},
		{name: "truncated payload", stream: f[0][:len(f[0])-1], want: authframe.ErrTruncated},
		{name: "truncated second frame", stream: cat(f[0], f[1][:headerSize]), good: 1, want: authframe.ErrTruncated},
		{name: "flipped payload bit", stream: mut(f[0], func(b []byte) { b[len(b)-1] ^= 0x01 }), want: authframe.ErrBadTag},
		{name: "flipped tag bit", stream: mut(f[0], func(b []byte) { b[12] ^= 0x80 }), want: authframe.ErrBadTag},
		{name: "kind swapped", stream: mut(f[0], func(b []byte) {
			binary.LittleEndian.PutUint32(b[16:], uint32(wirepb.FrameKind_FRAME_KIND_EXITING))
		}), want: authframe.ErrBadTag},
		{name: "wrong secret", stream: f[0], key: bytes.Repeat([]byte{2}, 32), want: authframe.ErrBadTag},
		{name: "reflected frame (other direction's key)", stream: frameBytes(t, connKey(k, dirToRank, hb[:], ab[:challengeCore]), hbeat(0))[0], key: connToCoord, want: authframe.ErrBadTag},
		{name: "spliced from another connection", stream: frameBytes(t, connKey(k, dirToCoord, hb1[:], ab1[:challengeCore]), hbeat(0))[0], key: connToCoord, want: authframe.ErrBadTag},
		{name: "recorded under the same hello, another ack", stream: frameBytes(t, connKey(k, dirToCoord, hb[:], abAgain[:challengeCore]), hbeat(0))[0], key: connToCoord, want: authframe.ErrBadTag},
		{name: "replayed frame", stream: cat(f[0], f[0]), good: 1, want: authframe.ErrBadTag},
		{name: "reordered frames", stream: cat(f[1], f[0]), want: authframe.ErrBadTag},
		{name: "dropped frame", stream: cat(f[0], f[2]), good: 1, want: authframe.ErrBadTag},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rk, max := key, uint32(MaxControlPayload)
			if tc.key != nil {
				rk = tc.key
			}
			if tc.max != 0 {
				max = tc.max
			}
			r := &frameReader{mac: authframe.NewMAC(rk), dir: dirToCoord, max: max}
			src := bytes.NewReader(tc.stream)
			for i := 0; i < tc.good; i++ {
				if _, _, err := r.readFrame(src); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
			}
			_, payload, err := r.readFrame(src)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			for _, other := range []error{authframe.ErrBadMagic, authframe.ErrBadVersion, authframe.ErrUnknownKind, authframe.ErrTooLarge, authframe.ErrTruncated, authframe.ErrBadTag} {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("error %q also matches %v", err, other)
				}
			}
			if payload != nil {
				t.Errorf("a refused frame handed on %d payload bytes", len(payload))
			}
			if tc.mention != "" && !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

// A declared length far over the limit is refused before anything near it
// is allocated; a length within the limit allocates as bytes arrive, not up
// front.
func TestReadFrameDoesNotAllocateDeclaredLength(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 32)
	header := func(n uint32) []byte {
		h := frameBytes(t, key, &wirepb.Heartbeat{})[0][:headerSize]
		binary.LittleEndian.PutUint32(h[20:], n)
		return h
	}
	for _, tc := range []struct {
		name     string
		declared uint32
		sent     int
		want     error
		maxAlloc uint64
	}{
		{"huge length", 0xFFFFFFF0, 100, authframe.ErrTooLarge, 64 << 10},
		{"limit-sized length, little sent", MaxControlPayload, 100, authframe.ErrTruncated, authframe.ReadChunk + 64<<10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := append(header(tc.declared), make([]byte, tc.sent)...)
			r := &frameReader{mac: authframe.NewMAC(key), dir: dirToCoord, max: MaxControlPayload}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, _, err := r.readFrame(bytes.NewReader(stream))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > tc.maxAlloc {
				t.Fatalf("reading a frame declaring %d bytes allocated %d bytes, want at most %d", tc.declared, got, tc.maxAlloc)
			}
		})
	}
}
