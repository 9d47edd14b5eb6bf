package ring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
)

// Link is one direction of the ring for one or more rounds: the dialer Sends, the
// listener Receives. Send and Receive are each called from one goroutine at
// a time (the one that owns that end's socket).
type Link struct {
	nc      net.Conn
	mac     *authframe.GMAC
	hello   Hello
	other   uint32 // the host at the other end
	timeout time.Duration
	bytes   uint64 // frame bytes moved, by the one goroutine using the link
}

// Hello names the link's round and ends.
func (l *Link) Hello() Hello { return l.hello }

// Bytes counts the frame bytes the link moved.
func (l *Link) Bytes() uint64 { return l.bytes }

// Close closes the socket, failing a Send or Receive in progress.
func (l *Link) Close() error { return l.nc.Close() }

// EncodeHeader returns a frame's header.
func EncodeHeader(step uint32, n uint64) []byte {
	b := make([]byte, 0, HeaderSize)
	b = le.AppendUint32(b, FrameMagic)
	b = le.AppendUint32(b, step)
	return le.AppendUint64(b, n)
}

// CheckHeader refuses a header that is not exactly the one expected: the
// reader knows every frame's step and length before it arrives.
func CheckHeader(b []byte, step uint32, n uint64) error {
	switch {
	case len(b) != HeaderSize:
		return fmt.Errorf("%w: frame header of %d bytes", authframe.ErrTruncated, len(b))
	case le.Uint32(b) != FrameMagic:
		return fmt.Errorf("%w: frame magic 0x%08x", authframe.ErrBadMagic, le.Uint32(b))
	case le.Uint32(b[4:]) != step || le.Uint64(b[8:]) != n:
		return fmt.Errorf("%w: frame of step %d and %d bytes, want step %d and %d bytes",
			authframe.ErrMalformed, le.Uint32(b[4:]), le.Uint64(b[8:]), step, n)
	}
	return nil
}

func (l *Link) fail(what string, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("ring: %s host %d's leader at %s: nothing moved for %v (peer gone): %w", what, l.peer(), l.nc.RemoteAddr(), l.timeout, err)
	}
	if authframe.IsEOF(err) {
		err = fmt.Errorf("%w: %w", authframe.ErrTruncated, err)
	}
	return fmt.Errorf("ring: %s host %d's leader at %s: %w", what, l.peer(), l.nc.RemoteAddr(), err)
}

func (l *Link) peer() uint32 { return l.other }

// errStopped is a Send's when its ready channel closed before a chunk was
// ready: the receive side of the ring failed.
var errStopped = errors.New("ring: the receive side stopped before the data to send was ready")

// Send sends data as step's frames. A goroutine tags chunk i+1 while this
// one writes chunk i; Send joins it before returning. With ready not nil,
// chunk i is tagged and sent only after the i-th value from ready (the
// chunk is final then); a closed ready stops Send. The link is unusable
// after an error.
func (l *Link) Send(step uint32, data []byte, ready <-chan struct{}) error {
	cs := Chunk(len(data))
	n := (len(data) + cs - 1) / cs
	type tagged struct {
		tag []byte
		err error
	}
	tags := make(chan tagged, 2)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range n {
			ok := true
			if ready != nil {
				select {
				case _, ok = <-ready:
				case <-quit:
					return
				}
			}
			t := tagged{err: errStopped}
			if ok {
				t = tagged{tag: append([]byte(nil), l.mac.Seal(data[i*cs:min(len(data), (i+1)*cs)])...)}
			}
			select {
			case tags <- t:
			case <-quit:
				return
			}
			if t.err != nil {
				return
			}
		}
	}()
	defer func() {
		close(quit)
		wg.Wait()
	}()
	for i := range n {
		c := data[i*cs : min(len(data), (i+1)*cs)]
		t := <-tags
		if t.err != nil {
			return t.err
		}
		if err := l.nc.SetWriteDeadline(time.Now().Add(l.timeout)); err != nil {
			return l.fail("send to", err)
		}
		bufs := net.Buffers{EncodeHeader(step, uint64(len(c))), c, t.tag}
		m, err := bufs.WriteTo(l.nc)
		l.bytes += uint64(m)
		if err != nil {
			return l.fail("send to", err)
		}
	}
	return nil
}

// Chunk is the payload of each frame (the last may be shorter) of an
// n-byte shard: n/32 rounded up to 4 KiB, within [MinChunk, ChunkSize].
// Each step delays the ring by one chunk's time on the wire, so about 32
// chunks a shard keep that under 1/32 of the transfer, while chunks of
// 64 KiB or more keep the per-frame costs (syscalls, tags) small.
func Chunk(n int) int {
	c := (n/32 + 4095) &^ 4095
	return min(ChunkSize, max(MinChunk, c))
}

type chunkIn struct {
	lo, hi int
	tag    [gtagSize]byte
}

// Receive reads step's frames into dst and calls reduce(lo, hi) on each
// chunk dst[lo:hi] once its tag verified, on a goroutine of its own while
// the next chunk arrives; Receive joins it before returning. Nothing of dst
// may be used unless Receive returned nil.
func (l *Link) Receive(step uint32, dst []byte, reduce func(lo, hi int)) error {
	n := (len(dst) + Chunk(len(dst)) - 1) / Chunk(len(dst))
	in := make(chan chunkIn, 2)
	verr := make(chan error, 1)
	go func() {
		var err error
		for c := range in {
			if err != nil {
				continue // drain
			}
			if err = l.mac.Verify(dst[c.lo:c.hi], c.tag[:]); err != nil {
				err = fmt.Errorf("ring: step %d from host %d: %w", step, l.peer(), err)
				continue
			}
			reduce(c.lo, c.hi)
		}
		verr <- err
	}()
	rerr := l.read(step, dst, n, in)
	close(in)
	if err := <-verr; err != nil {
		return err
	}
	return rerr
}

func (l *Link) read(step uint32, dst []byte, n int, in chan<- chunkIn) error {
	var hdr [HeaderSize]byte
	cs := Chunk(len(dst))
	for i := range n {
		c := chunkIn{lo: i * cs, hi: min(len(dst), (i+1)*cs)}
		if err := l.readFull(hdr[:]); err != nil {
			return l.fail("receive from", err)
		}
		if err := CheckHeader(hdr[:], step, uint64(c.hi-c.lo)); err != nil {
			return fmt.Errorf("ring: frame from host %d: %w", l.peer(), err)
		}
		if err := l.readFull(dst[c.lo:c.hi]); err != nil {
			return l.fail("receive from", err)
		}
		if err := l.readFull(c.tag[:]); err != nil {
			return l.fail("receive from", err)
		}
		in <- c
	}
	return nil
}

// readFull reads all of b, each read under the link's deadline.
func (l *Link) readFull(b []byte) error {
	return authframe.ReadFullWithin(l.nc, b, l.timeout, &l.bytes)
}

// closeOn closes links when ctx ends, so a blocked read or write fails at
// once; the returned stop disarms it.
func closeOn(ctx context.Context, links ...*Link) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		for _, l := range links {
			l.Close()
		}
	})
}
