package reduce

// The sending half of a Conn: Send queues whole frames, and the one writer
// goroutine tags and writes them in order, streaming a large payload through
// the MAC in chunks, and pings a quiet connection so the peer knows it lives.

import (
	"context"
	"fmt"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
)

type sendReq struct {
	kind  Kind
	parts [][]byte
	done  chan error
}

// Send queues a frame of kind whose payload is the concatenation of parts
// and waits until it is written, ctx ends, or the Conn closes. The parts
// must not change until Send returns. A failed write closes the connection.
func (c *Conn) Send(ctx context.Context, kind Kind, parts ...[]byte) error {
	done, err := c.SendAsync(kind, parts...)
	if err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// The frame may still go out; the stream stays in step either way,
		// because the writer only ever writes whole frames.
		return ctx.Err()
	}
}

// SendAsync queues a frame and returns at once; the channel yields the
// write's result. The parts must not change until it does.
func (c *Conn) SendAsync(kind Kind, parts ...[]byte) (<-chan error, error) {
	if kind.Dir() != c.sendDir || !kind.Known() {
		return nil, fmt.Errorf("reduce: cannot send %v on this end (it sends %v)", kind, c.sendDir)
	}
	var n uint64
	for _, p := range parts {
		n += uint64(len(p))
	}
	if err := checkLength(kind, n); err != nil {
		return nil, fmt.Errorf("reduce: send: %w", err)
	}
	req := &sendReq{kind: kind, parts: parts, done: make(chan error, 1)}
	c.smu.RLock()
	defer c.smu.RUnlock()
	if c.closed {
		return nil, c.errClosed()
	}
	// quit cannot close while the read lock is held, and the writer keeps
	// draining the queue until it does, so this send always completes.
	c.sendq <- req
	return req.done, nil
}

// checkLength refuses a payload over MaxControlPayload.
func checkLength(k Kind, n uint64) error {
	if n > MaxControlPayload {
		return fmt.Errorf("%w: %v frame of %d bytes, limit %d", authframe.ErrTooLarge, k, n, MaxControlPayload)
	}
	return nil
}

// writeLoop is the one goroutine that writes to the socket. mac tags the
// frames this end sends.
func (c *Conn) writeLoop(mac *authframe.MAC) {
	defer close(c.writerEnd)
	var werr error
	buf := make([]byte, 0, 4096)
	ping := time.NewTicker(c.opts.Timeout / 4)
	defer ping.Stop()
	quiet := true
	write := func(b []byte) error {
		for len(b) > 0 {
			n := min(len(b), chunk)
			if err := c.nc.SetWriteDeadline(time.Now().Add(c.opts.Timeout)); err != nil {
				return err
			}
			m, err := c.nc.Write(b[:n])
			c.sentBytes.Add(uint64(m))
			if err != nil {
				return err
			}
			b = b[n:]
		}
		return nil
	}
	send := func(kind Kind, parts [][]byte) error {
		if werr != nil {
			return werr
		}
		var n uint64
		for _, p := range parts {
			n += uint64(len(p))
		}
		var hdr [headerSize]byte
		le.PutUint32(hdr[0:], FrameMagic)
		le.PutUint16(hdr[4:], uint16(kind))
		le.PutUint16(hdr[6:], 0)
		le.PutUint64(hdr[8:], n)
		mac.Begin(hdr[:])
		var err error
		if n <= 1<<16 {
			buf = append(buf[:0], hdr[:]...)
			for _, p := range parts {
				mac.Write(p)
				buf = append(buf, p...)
			}
			buf = append(buf, mac.Seal()...)
			err = write(buf)
		} else {
			err = write(hdr[:])
			for _, p := range parts {
				for len(p) > 0 && err == nil {
					k := min(len(p), chunk)
					mac.Write(p[:k])
					err = write(p[:k])
					p = p[k:]
				}
			}
			if err == nil {
				err = write(mac.Seal())
			}
		}
		if err != nil {
			werr = fmt.Errorf("reduce: send %v to %s: %w", kind, c.nc.RemoteAddr(), err)
			c.nc.Close()
			return werr
		}
		return nil
	}
	for {
		select {
		case <-c.quit:
			return
		case req := <-c.sendq:
			req.done <- send(req.kind, req.parts)
			quiet = false
		case <-ping.C:
			if quiet {
				k := KindPingRank
				if c.sendDir == ToServer {
					k = KindPingServer
				}
				send(k, nil)
			}
			quiet = true
		}
	}
}
