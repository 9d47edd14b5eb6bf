package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"io"
	"slices"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

var le = binary.LittleEndian

// direction is the way a frame flows.
type direction uint8

const (
	dirToRank  direction = iota // coordinator -> rank: kinds below 64
	dirToCoord                  // rank -> coordinator: kinds from 64 on
)

func (d direction) String() string {
	if d == dirToRank {
		return "coordinator->rank"
	}
	return "rank->coordinator"
}

// dirOf returns the direction kind flows in.
func dirOf(kind wirepb.FrameKind) direction {
	if toRank(kind) {
		return dirToRank
	}
	return dirToCoord
}

// directionKey returns the key frames flowing in d are tagged under.
func (k Keys) directionKey(d direction) []byte {
	if d == dirToRank {
		return k.toRank
	}
	return k.toCoord
}

// connKey is the key for frames flowing in d on the connection that hello
// opened: it binds every frame to that connection's hello.
func connKey(k Keys, d direction, hello []byte) []byte {
	return hmacSum(k.directionKey(d), hello)
}

// frameMAC computes frame tags under one key.
type frameMAC struct {
	h   hash.Hash
	sum []byte
}

func newFrameMAC(key []byte) *frameMAC {
	return &frameMAC{h: hmac.New(sha256.New, key), sum: make([]byte, 0, sha256.Size)}
}

// tag returns the first 8 bytes of HMAC(seq u64 | kind u32 | len u32 | payload).
func (m *frameMAC) tag(seq uint64, kind uint32, payload []byte) []byte {
	var pre [16]byte
	le.PutUint64(pre[0:8], seq)
	le.PutUint32(pre[8:12], kind)
	le.PutUint32(pre[12:16], uint32(len(payload)))
	m.h.Reset()
	m.h.Write(pre[:])
	m.h.Write(payload)
	m.sum = m.h.Sum(m.sum[:0])
	return m.sum[:tagSize]
}

// frameWriter encodes the frames of one direction of one connection, in
// order. It is not safe for concurrent use (the Conn's writer goroutine owns
// it).
type frameWriter struct {
	mac *frameMAC
	seq uint64
}

// appendFrame appends one frame to dst and advances the sequence number. The
// caller has checked that payload fits the limit.
func (w *frameWriter) appendFrame(dst []byte, kind wirepb.FrameKind, payload []byte) []byte {
	start := len(dst)
	dst = le.AppendUint32(dst, FrameMagic)
	dst = le.AppendUint32(dst, Version)
	dst = append(dst, make([]byte, tagSize)...)
	dst = le.AppendUint32(dst, uint32(kind))
	dst = le.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, payload...)
	copy(dst[start+8:start+16], w.mac.tag(w.seq, uint32(kind), payload))
	w.seq++
	return dst
}

// readChunk bounds how much payload buffer is allocated ahead of the bytes
// that actually arrive.
const readChunk = 1 << 20

// frameReader decodes the frames of one direction of one connection, in
// order, refusing anything that does not verify. Once it has returned an
// error other than a clean io.EOF the stream is out of step and the reader
// must not be used again.
type frameReader struct {
	mac *frameMAC
	seq uint64
	dir direction // the direction whose kinds this reader accepts
	max uint32    // largest payload accepted
	hdr [headerSize]byte
}

// readFrame reads one frame from src. EOF before the first byte is a clean
// io.EOF.
func (r *frameReader) readFrame(src io.Reader) (wirepb.FrameKind, []byte, error) {
	if _, err := io.ReadFull(src, r.hdr[:1]); err != nil {
		if err == io.EOF {
			return 0, nil, io.EOF
		}
		return 0, nil, fmt.Errorf("wire: read frame: %w", err)
	}
	return r.readRest(src)
}

// readRest reads the rest of a frame whose first header byte is in r.hdr[0].
// Checks run in order: magic, version, kind, length (before any allocation),
// payload, tag. Only a verified payload is returned.
func (r *frameReader) readRest(src io.Reader) (wirepb.FrameKind, []byte, error) {
	if n, err := io.ReadFull(src, r.hdr[1:]); err != nil {
		return 0, nil, fmt.Errorf("%w: frame header: got %d of %d bytes: %w", ErrTruncated, 1+n, headerSize, err)
	}
	if magic := le.Uint32(r.hdr[0:4]); magic != FrameMagic {
		return 0, nil, fmt.Errorf("%w: frame magic 0x%08x, want 0x%08x", ErrBadMagic, magic, FrameMagic)
	}
	if v := le.Uint32(r.hdr[4:8]); v != Version {
		return 0, nil, fmt.Errorf("%w: frame version %d, want %d", ErrBadVersion, v, Version)
	}
	kind := wirepb.FrameKind(le.Uint32(r.hdr[16:20]))
	if newMessage(kind) == nil {
		return 0, nil, fmt.Errorf("%w: frame kind %d is not in wire.proto", ErrUnknownKind, uint32(kind))
	}
	if d := dirOf(kind); d != r.dir {
		return 0, nil, fmt.Errorf("%w: frame kind %s (%d) flows %s, this reader accepts %s kinds only",
			ErrUnknownKind, kind, uint32(kind), d, r.dir)
	}
	n := le.Uint32(r.hdr[20:24])
	if n > r.max {
		return 0, nil, fmt.Errorf("%w: frame %s declares %d payload bytes, limit %d", ErrTooLarge, kind, n, r.max)
	}
	payload, err := readPayload(src, int(n))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: frame %s payload: got %d of %d bytes: %w", ErrTruncated, kind, len(payload), n, err)
	}
	if !hmac.Equal(r.mac.tag(r.seq, uint32(kind), payload), r.hdr[8:16]) {
		return 0, nil, fmt.Errorf("%w: frame %s (%d payload bytes) at sequence %d: wrong key, or a tampered, replayed, dropped or reordered frame",
			ErrBadTag, kind, n, r.seq)
	}
	r.seq++
	return kind, payload, nil
}

// readPayload reads exactly n bytes, growing its buffer as bytes arrive so a
// peer that declares much and sends little costs little. On error it returns
// what it got.
func readPayload(src io.Reader, n int) ([]byte, error) {
	buf := make([]byte, 0, min(n, readChunk))
	for len(buf) < n {
		step := min(n-len(buf), readChunk)
		buf = slices.Grow(buf, step)
		m, err := io.ReadFull(src, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
