package reduce

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
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

// chunk is the unit of streamed reads and writes of a large payload; each
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

func newConn(nc net.Conn, k Keys, h Hello, hello, challengeCore []byte, sendDir Dir, o Options) *Conn {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &Conn{
		nc:        nc,
		hello:     h,
		opts:      o,
		sendDir:   sendDir,
		rmac:      authframe.NewMAC(k.connKey(sendDir.other(), hello, challengeCore)),
		sendq:     make(chan *sendReq, 64),
		quit:      make(chan struct{}),
		writerEnd: make(chan struct{}),
	}
	go c.writeLoop(authframe.NewMAC(k.connKey(sendDir, hello, challengeCore)))
	return c
}

// Hello is the hello that opened the connection.
func (c *Conn) Hello() Hello { return c.hello }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// BytesSent and BytesReceived count the frame bytes that crossed the socket.
func (c *Conn) BytesSent() uint64     { return c.sentBytes.Load() }
func (c *Conn) BytesReceived() uint64 { return c.recvBytes.Load() }

func (c *Conn) errClosed() error {
	return fmt.Errorf("reduce: connection to %s: %w", c.nc.RemoteAddr(), net.ErrClosed)
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
