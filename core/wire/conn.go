package wire

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"google.golang.org/protobuf/proto"
)

// Default timeouts.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultReadTimeout      = 60 * time.Second
	DefaultWriteTimeout     = 30 * time.Second
)

// Option tunes a Conn; pass options to ClientHandshake or ServerHandshake.
type Option func(*options)

type options struct {
	handshakeTimeout time.Duration
	idleTimeout      time.Duration
	readTimeout      time.Duration
	writeTimeout     time.Duration
	maxPayload       uint32
	tls              *tls.Config
}

func buildOptions(opts []Option) options {
	o := options{
		handshakeTimeout: DefaultHandshakeTimeout,
		readTimeout:      DefaultReadTimeout,
		writeTimeout:     DefaultWriteTimeout,
		maxPayload:       MaxControlPayload,
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// WithHandshakeTimeout bounds the whole handshake (default 10 s; a sooner
// ctx deadline wins). Zero or less means ctx alone bounds it.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(o *options) { o.handshakeTimeout = d }
}

// WithIdleTimeout makes Receive give up, with an error wrapping
// os.ErrDeadlineExceeded, when no frame begins within d (default: no idle
// timeout, ctx alone bounds the wait). The connection stays usable.
func WithIdleTimeout(d time.Duration) Option {
	return func(o *options) { o.idleTimeout = d }
}

// WithReadTimeout bounds how long the rest of a frame may take once its first
// byte has arrived (default 60 s). Zero or less means no bound.
func WithReadTimeout(d time.Duration) Option {
	return func(o *options) { o.readTimeout = d }
}

// WithWriteTimeout bounds each frame's write (default 30 s). Zero or less
// means no bound.
func WithWriteTimeout(d time.Duration) Option {
	return func(o *options) { o.writeTimeout = d }
}

// WithMaxPayload lowers the largest payload this end sends or accepts
// (default and ceiling MaxControlPayload; larger values are clamped to it).
func WithMaxPayload(n uint32) Option {
	return func(o *options) { o.maxPayload = min(n, MaxControlPayload) }
}

// WithTLS runs the connection inside mutual TLS (cfg from shared/mtls:
// a server configuration for ServerHandshake, a client one for
// ClientHandshake): the TLS handshake comes first, within the handshake
// timeout of its own, and the hello, ack and frames travel inside it,
// authenticated by the run's secret as without TLS. Nil: plain TCP.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.tls = cfg }
}

// Conn is one authenticated control connection, after the handshake.
//
// Send may be called from any number of goroutines: one goroutine owned by
// the Conn does every socket write, one whole frame at a time, in the order
// the frames are queued. Receive must be called from one goroutine at a time
// (a concurrent call is refused).
type Conn struct {
	nc      net.Conn
	hello   Hello
	opts    options
	sendDir direction

	rmu  sync.Mutex // held by the one running Receive
	rd   frameReader
	rerr error // sticky: the inbound stream is out of step or over

	sendq     chan *sendReq
	quit      chan struct{} // closed by Close
	writerEnd chan struct{} // closed when the writer goroutine returns
	closeOnce sync.Once
	closeErr  error
}

// A sendReq is one frame queued for the writer goroutine. Its state moves
// from pending to taken (by the writer, which then always answers on done)
// or to cancelled (by Send giving up, after which the writer skips it).
type sendReq struct {
	kind    wirepb.FrameKind
	payload []byte
	state   atomic.Int32
	done    chan error
}

const (
	reqPending int32 = iota
	reqTaken
	reqCancelled
)

func newConn(nc net.Conn, keys Keys, hello Hello, hb, cc []byte, sendDir direction, o options) *Conn {
	recvDir := dirToRank
	if sendDir == dirToRank {
		recvDir = dirToCoord
	}
	c := &Conn{
		nc:        nc,
		hello:     hello,
		opts:      o,
		sendDir:   sendDir,
		rd:        frameReader{mac: authframe.NewMAC(connKey(keys, recvDir, hb, cc)), dir: recvDir, max: o.maxPayload},
		sendq:     make(chan *sendReq, 16),
		quit:      make(chan struct{}),
		writerEnd: make(chan struct{}),
	}
	go c.writeLoop(&frameWriter{mac: authframe.NewMAC(connKey(keys, sendDir, hb, cc))})
	return c
}

// Hello returns the hello that opened the connection.
func (c *Conn) Hello() Hello { return c.hello }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Send queues msg and waits until its frame has been written, ctx ends, or
// the Conn closes. Once the writer has begun a frame, Send waits for that
// write to finish (bounded by the write timeout) and reports its result, so
// a nil error means the whole frame reached the socket. msg must flow in
// this end's direction. A failed write closes the connection, because the
// peer can no longer find the next frame.
func (c *Conn) Send(ctx context.Context, msg proto.Message) error {
	kind, payload, err := Encode(msg)
	if err != nil {
		return err
	}
	if d := dirOf(kind); d != c.sendDir {
		return fmt.Errorf("wire: cannot send %s on this end: it flows %s, this end sends %s", kind, d, c.sendDir)
	}
	if len(payload) > int(c.opts.maxPayload) {
		return fmt.Errorf("wire: %w: %s is %d bytes, limit %d", authframe.ErrTooLarge, kind, len(payload), c.opts.maxPayload)
	}
	req := &sendReq{kind: kind, payload: payload, done: make(chan error, 1)}
	select {
	case <-c.quit:
		return c.errClosed()
	default:
	}
	select {
	case c.sendq <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.quit:
		return c.errClosed()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		if req.state.CompareAndSwap(reqPending, reqCancelled) {
			return ctx.Err()
		}
	case <-c.quit:
		if req.state.CompareAndSwap(reqPending, reqCancelled) {
			return c.errClosed()
		}
	}
	return <-req.done // the writer took it and always answers
}

func (c *Conn) errClosed() error {
	return fmt.Errorf("wire: connection to %s: %w", c.nc.RemoteAddr(), net.ErrClosed)
}

// writeLoop is the one goroutine that writes to the socket.
func (c *Conn) writeLoop(w *frameWriter) {
	defer close(c.writerEnd)
	var buf []byte
	var werr error // sticky: a failed write leaves the stream out of step
	for {
		select {
		case <-c.quit:
			return
		case req := <-c.sendq:
			if !req.state.CompareAndSwap(reqPending, reqTaken) {
				continue
			}
			if werr != nil {
				req.done <- werr
				continue
			}
			buf = w.appendFrame(buf[:0], req.kind, req.payload)
			var dl time.Time
			if c.opts.writeTimeout > 0 {
				dl = time.Now().Add(c.opts.writeTimeout)
			}
			err := c.nc.SetWriteDeadline(dl)
			if err == nil {
				_, err = c.nc.Write(buf)
			}
			if err != nil {
				werr = fmt.Errorf("wire: send %s to %s: %w", req.kind, c.nc.RemoteAddr(), err)
				c.nc.Close()
				err = werr
			}
			req.done <- err
			if cap(buf) > authframe.ReadChunk {
				buf = nil
			}
		}
	}
}

// Receive reads and decodes the next frame. While no frame has begun, the
// wait is bounded by ctx and the idle timeout, and either ending it leaves
// the connection usable. Once a frame's first byte has arrived, the rest must
// arrive within the read timeout whatever ctx does, so a frame is never left
// half-read. A frame that fails any check ends the inbound stream: that call
// and every later one return the error. A peer's clean close between frames
// is io.EOF.
//
// Receive must be called from one goroutine at a time.
func (c *Conn) Receive(ctx context.Context) (proto.Message, error) {
	if !c.rmu.TryLock() {
		return nil, errors.New("wire: concurrent Receive on one Conn")
	}
	defer c.rmu.Unlock()
	if c.rerr != nil {
		return nil, c.rerr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Idle: wait for a frame's first byte.
	// Setting a deadline fails only on a connection that is closed or whose
	// peer has gone (net.Pipe); the read then reports what happened.
	_ = c.nc.SetReadDeadline(authframe.Deadline(ctx, time.Now(), c.opts.idleTimeout))
	stop := authframe.InterruptOn(ctx, c.nc.SetReadDeadline)
	_, err := io.ReadFull(c.nc, c.rd.hdr[:1])
	stop()
	if err != nil {
		switch {
		case err == io.EOF:
			return nil, c.failRead(io.EOF)
		case errors.Is(err, os.ErrDeadlineExceeded):
			if cerr := authframe.CtxErr(ctx); cerr != nil {
				return nil, cerr
			}
			return nil, fmt.Errorf("wire: no frame from %s within %v: %w", c.nc.RemoteAddr(), c.opts.idleTimeout, err)
		default:
			return nil, c.failRead(fmt.Errorf("wire: receive from %s: %w", c.nc.RemoteAddr(), err))
		}
	}

	// Committed: the rest of the frame, under the read timeout.
	var rdl time.Time
	if c.opts.readTimeout > 0 {
		rdl = time.Now().Add(c.opts.readTimeout)
	}
	_ = c.nc.SetReadDeadline(rdl)
	kind, payload, err := c.rd.readRest(c.nc)
	if err != nil {
		return nil, c.failRead(fmt.Errorf("wire: receive from %s: %w", c.nc.RemoteAddr(), err))
	}
	msg, err := Decode(kind, payload)
	if err != nil {
		// The frame verified, so the stream is still in step.
		return nil, fmt.Errorf("wire: receive from %s: %w", c.nc.RemoteAddr(), err)
	}
	return msg, nil
}

func (c *Conn) failRead(err error) error {
	c.rerr = err
	return err
}

// Close stops the writer goroutine, waits for it, and closes the socket. A
// Send still waiting returns an error wrapping net.ErrClosed; a blocked
// Receive returns an error. Close is idempotent.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.quit)
		// Closing the socket first unblocks a write in progress.
		if err := c.nc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			c.closeErr = fmt.Errorf("wire: close connection to %s: %w", c.nc.RemoteAddr(), err)
		}
		<-c.writerEnd
	})
	return c.closeErr
}
