package wire

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
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

// The tag sits inside the header, so it covers the header's bytes after it:
// kind and length. The kernel's MAC puts the sequence number before them.
const tagged = 16 // header offset of the tagged bytes

// frameWriter encodes the frames of one direction of one connection, in
// order. It is not safe for concurrent use (the Conn's writer goroutine owns
// it).
type frameWriter struct {
	mac *authframe.MAC
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
	w.mac.Begin(dst[start+tagged : start+headerSize])
	w.mac.Write(payload)
	copy(dst[start+8:start+tagged], w.mac.Seal())
	return append(dst, payload...)
}

// frameReader decodes the frames of one direction of one connection, in
// order, refusing anything that does not verify. Once it has returned an
// error other than a clean io.EOF the stream is out of step and the reader
// must not be used again.
type frameReader struct {
	mac *authframe.MAC
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
		return 0, nil, fmt.Errorf("%w: frame header: got %d of %d bytes: %w", authframe.ErrTruncated, 1+n, headerSize, err)
	}
	if magic := le.Uint32(r.hdr[0:4]); magic != FrameMagic {
		return 0, nil, fmt.Errorf("%w: frame magic 0x%08x, want 0x%08x", authframe.ErrBadMagic, magic, FrameMagic)
	}
	if v := le.Uint32(r.hdr[4:8]); v != Version {
		return 0, nil, fmt.Errorf("%w: frame version %d, want %d", authframe.ErrBadVersion, v, Version)
	}
	kind := wirepb.FrameKind(le.Uint32(r.hdr[16:20]))
	if newMessage(kind) == nil {
		return 0, nil, fmt.Errorf("%w: frame kind %d is not in wire.proto", authframe.ErrUnknownKind, uint32(kind))
	}
	if d := dirOf(kind); d != r.dir {
		return 0, nil, fmt.Errorf("%w: frame kind %s (%d) flows %s, this reader accepts %s kinds only",
			authframe.ErrUnknownKind, kind, uint32(kind), d, r.dir)
	}
	n := le.Uint32(r.hdr[20:24])
	payload, err := authframe.ReadPayload(src, uint64(n), uint64(r.max))
	if err != nil {
		return 0, nil, fmt.Errorf("frame %s: %w", kind, err)
	}
	r.mac.Begin(r.hdr[tagged:headerSize])
	r.mac.Write(payload)
	if err := r.mac.Verify(r.hdr[8:tagged]); err != nil {
		return 0, nil, fmt.Errorf("frame %s (%d payload bytes): %w", kind, n, err)
	}
	return kind, payload, nil
}
