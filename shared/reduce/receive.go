package reduce

// The receiving half of a Conn: every frame's header is checked before
// anything is read or allocated, and nothing is returned until the tag
// verifies.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
)

// Frame is one verified frame.
type Frame struct {
	Kind Kind
	// Payload is valid until the next Receive.
	Payload []byte
}

// Receive reads the next frame, skipping pings. Every read has the
// connection's timeout as its deadline. It checks the header before reading
// or allocating anything and returns only a frame whose tag verified. A
// frame that fails any check ends the inbound stream: that call and every
// later one return the error, and the caller should Close. A clean close
// between frames is io.EOF.
func (c *Conn) Receive() (Frame, error) {
	if !c.rmu.TryLock() {
		return Frame{}, errors.New("reduce: concurrent Receive on one Conn")
	}
	defer c.rmu.Unlock()
	for {
		if c.rerr != nil {
			return Frame{}, c.rerr
		}
		f, err := c.receive()
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

// ErrByeCut is a goodbye frame whose tag never arrived: the connection
// closed under it, which at a rank's exit is a goodbye all the same.
var ErrByeCut = errors.New("goodbye frame cut off by the connection closing")

func (c *Conn) receive() (Frame, error) {
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
	if err := checkLength(kind, n); err != nil {
		return Frame{}, fmt.Errorf("reduce: frame from %s refused: %w", peer, err)
	}
	c.rmac.Begin(hdr[:])
	if uint64(cap(c.rbuf)) < n {
		c.rbuf = make([]byte, n)
	}
	f := Frame{Kind: kind, Payload: c.rbuf[:n]}
	parts := [][]byte{f.Payload}
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
		if kind == KindBye {
			// The peer said goodbye and closed, and a write to it closed
			// this end before the tag was read: it left either way.
			return Frame{}, fmt.Errorf("reduce: %w: from %s: %w", ErrByeCut, peer, err)
		}
		return Frame{}, fmt.Errorf("reduce: %w: %v frame from %s ended before its tag: %w", authframe.ErrTruncated, kind, peer, err)
	}
	if err := c.rmac.Verify(tag[:]); err != nil {
		return Frame{}, fmt.Errorf("reduce: %v frame from %s: %w", kind, peer, err)
	}
	return f, nil
}
