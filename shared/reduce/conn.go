package reduce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cohortdl/cohort/internal/authframe"
)

// Dir is the way a frame flows.
type Dir uint8

// The two directions.
const (
	ToServer Dir = iota // rank -> reduce server
	ToRank              // reduce server -> rank
)

func (d Dir) String() string {
	if d == ToServer {
		return "rank->server"
	}
	return "server->rank"
}

func (d Dir) other() Dir { return 1 - d }

// Options tune a Conn.
type Options struct {
	// Timeout bounds the handshake and every read and write: a peer silent
	// for longer (both ends ping every Timeout/4 while idle) is gone.
	// Default 30 s.
	Timeout time.Duration
}

// DefaultTimeout is Options.Timeout's default.
const DefaultTimeout = 30 * time.Second

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return o
}

// chunk is the unit of streamed reads and writes of a bulk payload; each
// gets its own deadline.
const chunk = authframe.ReadChunk

// Conn is one authenticated data-channel connection after the handshake.
//
// One goroutine owned by the Conn does every socket write, whole frames in
// queue order, and sends a ping whenever the connection has been quiet for a
// quarter of the timeout. Receive must be called from one goroutine at a
// time; it answers pings itself and never returns one.
type Conn struct {
	nc      net.Conn
	hello   Hello
	opts    Options
	sendDir Dir

	rmu  sync.Mutex
	rmac *authframe.MAC
	rerr error
	rbuf []byte

	smu       sync.RWMutex // read-held while queueing; Close write-holds it to close quit
	closed    bool
	sendq     chan *sendReq
	quit      chan struct{}
	writerEnd chan struct{}
	closeOnce sync.Once

	sentBytes, recvBytes atomic.Uint64
}

type sendReq struct {
	kind  Kind
	parts [][]byte
	done  chan error
}

func newConn(nc net.Conn, k Keys, h Hello, hello, ackCore []byte, sendDir Dir, o Options) *Conn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &Conn{
		nc:        nc,
		hello:     h,
		opts:      o,
		sendDir:   sendDir,
		rmac:      authframe.NewMAC(k.connKey(sendDir.other(), hello, ackCore)),
		sendq:     make(chan *sendReq, 64),
		quit:      make(chan struct{}),
		writerEnd: make(chan struct{}),
	}
	go c.writeLoop(authframe.NewMAC(k.connKey(sendDir, hello, ackCore)))
	return c
}

// Hello is the hello that opened the connection.
func (c *Conn) Hello() Hello { return c.hello }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// BytesSent and BytesReceived count the frame bytes that crossed the socket.
func (c *Conn) BytesSent() uint64     { return c.sentBytes.Load() }
func (c *Conn) BytesReceived() uint64 { return c.recvBytes.Load() }

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
	if err := c.checkLength(kind, n); err != nil {
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

func (c *Conn) errClosed() error {
	return fmt.Errorf("reduce: connection to %s: %w", c.nc.RemoteAddr(), net.ErrClosed)
}

// checkLength refuses a payload length kind may not have: a control
// frame's is at most MaxControlPayload; a bulk frame's is exactly the
// header and the geometry's elements, in f32 or in the hello's wire.
func (c *Conn) checkLength(k Kind, n uint64) error {
	if !k.Bulk() {
		if n > MaxControlPayload {
			return fmt.Errorf("%w: %v frame of %d bytes, limit %d", authframe.ErrTooLarge, k, n, MaxControlPayload)
		}
		return nil
	}
	e := c.hello.Elements()
	f32, wire := BulkHeaderSize+e*WireF32.Size(), BulkHeaderSize+e*c.hello.Wire.Size()
	if n != f32 && n != wire {
		if n > f32 {
			return fmt.Errorf("%w: %v frame of %d bytes, the layout's is %d (f32) or %d (%v)", authframe.ErrTooLarge, k, n, f32, wire, c.hello.Wire)
		}
		return fmt.Errorf("%w: %v frame of %d bytes, the layout's is %d (f32) or %d (%v)", authframe.ErrMalformed, k, n, f32, wire, c.hello.Wire)
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

// Close stops the writer, closes the socket (unblocking a Receive) and
// waits for the writer to return. Idempotent.
func (c *Conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		// Closing the socket first fails a write in progress, so the writer
		// drains the queue quickly while Close waits for the lock.
		if e := c.nc.Close(); e != nil && !errors.Is(e, net.ErrClosed) {
			err = e
		}
		c.smu.Lock()
		c.closed = true
		close(c.quit)
		c.smu.Unlock()
		<-c.writerEnd
		// Answer the frames still queued.
		for {
			select {
			case req := <-c.sendq:
				req.done <- c.errClosed()
			default:
				return
			}
		}
	})
	return err
}
