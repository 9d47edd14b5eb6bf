package authframe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Deadline returns now+timeout (no deadline if timeout <= 0), or ctx's
// deadline if that is sooner.
func Deadline(ctx context.Context, now time.Time, timeout time.Duration) time.Time {
	var dl time.Time
	if timeout > 0 {
		dl = now.Add(timeout)
	}
	if cd, ok := ctx.Deadline(); ok && (dl.IsZero() || cd.Before(dl)) {
		return cd
	}
	return dl
}

// CtxErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has
// passed even if ctx has not noticed yet (a socket deadline set from it may
// fire first).
func CtxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// CtxCause turns a socket deadline error that ctx caused (its deadline, or
// InterruptOn) into ctx's error, so the caller reads "context canceled"
// rather than "i/o timeout". Any other error is returned as it is.
func CtxCause(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := CtxErr(ctx); cerr != nil {
			return cerr
		}
	}
	return err
}

// InterruptOn makes ctx's end interrupt blocked socket I/O by moving the
// deadline (through set, a SetDeadline method) into the past. Once stop
// returns it never fires, so the caller may then set a deadline of its own
// without a late interrupt overwriting it.
func InterruptOn(ctx context.Context, set func(time.Time) error) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	var mu sync.Mutex
	disarmed := false
	stopAfter := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !disarmed {
			set(time.Unix(1, 0))
		}
	})
	return func() {
		stopAfter()
		mu.Lock()
		disarmed = true
		mu.Unlock()
	}
}

// WithDeadline runs f, a handshake, with nc's deadline at timeout from now
// (or ctx's deadline if sooner) and ctx's end interrupting it, then clears
// the deadline. f's error is returned as it is; f should pass its I/O errors
// through CtxCause.
func WithDeadline(ctx context.Context, nc net.Conn, timeout time.Duration, f func() error) error {
	if err := nc.SetDeadline(Deadline(ctx, time.Now(), timeout)); err != nil {
		return fmt.Errorf("set deadline on %s: %w", nc.RemoteAddr(), err)
	}
	stop := InterruptOn(ctx, nc.SetDeadline)
	err := f()
	stop()
	if err == nil {
		if err = nc.SetDeadline(time.Time{}); err != nil {
			err = fmt.Errorf("clear deadline on %s: %w", nc.RemoteAddr(), err)
		}
	}
	return err
}

// SendHello is a client's half of a handshake: under WithDeadline it
// writes hello, reads exactly len(ack) bytes of answer into ack, and runs
// check on them (inside the deadline, so a bad answer is reported as such
// even when the peer hung up right after it). proto prefixes the errors
// ("wire", "reduce"); hangUp says what the peer closing without a full
// answer means on that protocol.
func SendHello(ctx context.Context, nc net.Conn, timeout time.Duration, hello, ack []byte, proto, hangUp string, check func() error) error {
	return WithDeadline(ctx, nc, timeout, func() error {
		if _, err := nc.Write(hello); err != nil {
			return fmt.Errorf("%s: send hello to %s: %w", proto, nc.RemoteAddr(), CtxCause(ctx, err))
		}
		if n, err := io.ReadFull(nc, ack); err != nil {
			if IsEOF(err) {
				return fmt.Errorf("%s: %w: ack from %s: got %d of %d bytes; %s: %w",
					proto, ErrTruncated, nc.RemoteAddr(), n, len(ack), hangUp, err)
			}
			return fmt.Errorf("%s: read ack from %s: got %d of %d bytes: %w", proto, nc.RemoteAddr(), n, len(ack), CtxCause(ctx, err))
		}
		if err := check(); err != nil {
			return fmt.Errorf("%s: handshake with %s: %w", proto, nc.RemoteAddr(), err)
		}
		return nil
	})
}

// ReadHello is the first read of a server's half of a handshake, inside
// its WithDeadline: exactly len(hello) bytes, or an error saying how many
// came. proto prefixes the errors.
func ReadHello(ctx context.Context, nc net.Conn, hello []byte, proto string) error {
	if n, err := io.ReadFull(nc, hello); err != nil {
		if IsEOF(err) {
			return fmt.Errorf("%s: %w: hello from %s: got %d of %d bytes: %w", proto, ErrTruncated, nc.RemoteAddr(), n, len(hello), err)
		}
		return fmt.Errorf("%s: read hello from %s: got %d of %d bytes: %w", proto, nc.RemoteAddr(), n, len(hello), CtxCause(ctx, err))
	}
	return nil
}

// IsEOF reports whether err is the stream ending, cleanly or mid-read.
func IsEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// ReadFullWithin reads all of b from nc in reads of at most ReadChunk, each
// under a deadline of timeout from its start (a peer that moves nothing
// for that long is gone; one that moves slowly is not), adding the bytes
// read to *n. A stream that ends early is io.ErrUnexpectedEOF.
func ReadFullWithin(nc net.Conn, b []byte, timeout time.Duration, n *uint64) error {
	for len(b) > 0 {
		if err := nc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		m, err := nc.Read(b[:min(len(b), ReadChunk)])
		*n += uint64(m)
		b = b[m:]
		if err != nil && len(b) > 0 {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}
