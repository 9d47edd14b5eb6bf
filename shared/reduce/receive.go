package reduce

// The receiving half of a Conn: every frame's header is checked before
// anything is read or allocated, a bulk payload is read straight into the
// destination its caller chose, and nothing is returned until the tag
// verifies.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cohortdl/cohort/internal/authframe"
)

// Frame is one verified frame.
type Frame struct {
	Kind Kind
	// Payload is a control frame's payload, or a bulk frame's 32-byte
	// header; it is valid until the next Receive.
	Payload []byte
	// Data is a bulk frame's data: the slice dest returned, now holding
	// verified bytes.
	Data []byte
}

// Dest chooses where a bulk frame's data goes: a slice of exactly n bytes
// that nothing else reads until Receive returns, or an error refusing the
// frame. It is called before any of the data is read.
type Dest func(kind Kind, n uint64) ([]byte, error)

// Receive reads the next frame, skipping pings. Every read has the
// connection's timeout as its deadline. It checks the header before reading
// or allocating anything, reads a bulk frame's data into the slice dest
// returns, and returns only a frame whose tag verified. A frame that fails
// any check ends the inbound stream: that call and every later one return
// the error, and the caller should Close. A clean close between frames is
// io.EOF.
func (c *Conn) Receive(dest Dest) (Frame, error) {
	if !c.rmu.TryLock() {
		return Frame{}, errors.New("reduce: concurrent Receive on one Conn")
	}
	defer c.rmu.Unlock()
	for {
		if c.rerr != nil {
			return Frame{}, c.rerr
		}
		f, err := c.receive(dest)
		if err != nil {
			c.rerr = err
			return Frame{}, err
		}
		if f.Kind == KindPingServer || f.Kind == KindPingRank {
			continue
		}
		return f, nil
	}
}

func (c *Conn) readFull(b []byte) (int, error) {
	got := 0
	for got < len(b) {
		if err := c.nc.SetReadDeadline(time.Now().Add(c.opts.Timeout)); err != nil {
			return got, err
		}
		n, err := c.nc.Read(b[got:min(len(b), got+chunk)])
		got += n
		c.recvBytes.Add(uint64(n))
		if err != nil {
			if err == io.EOF && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return got, err
		}
	}
	return got, nil
}

func (c *Conn) receive(dest Dest) (Frame, error) {
	peer := c.nc.RemoteAddr()
	var hdr [headerSize]byte
	if n, err := c.readFull(hdr[:]); err != nil {
		switch {
		case n == 0 && err == io.EOF:
			return Frame{}, io.EOF
		case authframe.IsEOF(err):
			return Frame{}, fmt.Errorf("reduce: %w: frame header from %s: got %d of %d bytes", authframe.ErrTruncated, peer, n, headerSize)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return Frame{}, fmt.Errorf("reduce: nothing from %s for %v (peer gone): %w", peer, c.opts.Timeout, err)
		}
		return Frame{}, fmt.Errorf("reduce: receive from %s: %w", peer, err)
	}
	if m := le.Uint32(hdr[0:]); m != FrameMagic {
		return Frame{}, fmt.Errorf("reduce: %w: frame magic 0x%08x from %s, want 0x%08x", authframe.ErrBadMagic, m, peer, FrameMagic)
	}
	kind := Kind(le.Uint16(hdr[4:]))
	if fl := le.Uint16(hdr[6:]); fl != 0 {
		return Frame{}, fmt.Errorf("reduce: %w: frame flags 0x%x from %s, want 0", authframe.ErrMalformed, fl, peer)
	}
	recvDir := c.sendDir.other()
	if !kind.Known() || kind.Dir() != recvDir {
		return Frame{}, fmt.Errorf("reduce: %w: kind 0x%04x from %s (expecting %v frames)", authframe.ErrUnknownKind, uint16(kind), peer, recvDir)
	}
	n := le.Uint64(hdr[8:])
	if err := c.checkLength(kind, n); err != nil {
		return Frame{}, fmt.Errorf("reduce: frame from %s refused: %w", peer, err)
	}
	c.rmac.Begin(hdr[:])
	f := Frame{Kind: kind}
	var parts [][]byte
	if kind.Bulk() {
		if dest == nil {
			return Frame{}, fmt.Errorf("reduce: %w: unexpected %v frame from %s", authframe.ErrUnknownKind, kind, peer)
		}
		data, err := dest(kind, n-BulkHeaderSize)
		if err != nil {
			return Frame{}, fmt.Errorf("reduce: %v frame from %s refused: %w", kind, peer, err)
		}
		if uint64(len(data)) != n-BulkHeaderSize {
			return Frame{}, fmt.Errorf("reduce: %v destination holds %d bytes, frame carries %d", kind, len(data), n-BulkHeaderSize)
		}
		if cap(c.rbuf) < BulkHeaderSize {
			c.rbuf = make([]byte, BulkHeaderSize)
		}
		f.Payload, f.Data = c.rbuf[:BulkHeaderSize], data
		parts = [][]byte{f.Payload, data}
	} else {
		if uint64(cap(c.rbuf)) < n {
			c.rbuf = make([]byte, n)
		}
		f.Payload = c.rbuf[:n]
		parts = [][]byte{f.Payload}
	}
	for _, p := range parts {
		for len(p) > 0 {
			k := min(len(p), chunk)
			got, err := c.readFull(p[:k])
			if err != nil {
				if authframe.IsEOF(err) || errors.Is(err, os.ErrDeadlineExceeded) {
					return Frame{}, fmt.Errorf("reduce: %w: %v frame from %s ended inside its %d-byte payload: %w", authframe.ErrTruncated, kind, peer, n, err)
				}
				return Frame{}, fmt.Errorf("reduce: receive %v from %s: %w", kind, peer, err)
			}
			c.rmac.Write(p[:got])
			p = p[k:]
		}
	}
	var tag [tagSize]byte
	if _, err := c.readFull(tag[:]); err != nil {
		return Frame{}, fmt.Errorf("reduce: %w: %v frame from %s ended before its tag: %w", authframe.ErrTruncated, kind, peer, err)
	}
	if err := c.rmac.Verify(tag[:]); err != nil {
		return Frame{}, fmt.Errorf("reduce: %v frame from %s: %w", kind, peer, err)
	}
	return f, nil
}
