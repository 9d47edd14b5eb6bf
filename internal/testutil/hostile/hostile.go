// Package hostile throws hostile connections at a listening port, for the
// tests of cohort's servers (the control server, the reduce server) and of
// a vendor's averager that listens on a channel of its own: each
// connection sends something no honest peer would, and the server must
// drop it within a deadline. Memory, goroutines and log lines are the
// caller's to check; Settle helps with the first two.
package hostile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"
)

// Case is one hostile connection: it sends Send, then stays silent.
type Case struct {
	Name string
	Send []byte
}

// Cases are the inputs every server must drop: random bytes, a header
// whose every length field reads 4 GiB - 1, a hello tagged under another
// secret (wrongSecret, built by the caller with its protocol's client),
// a handshake cut off after its first bytes, and a connection that sends
// nothing at all.
func Cases(wrongSecret []byte) []Case {
	garbage := make([]byte, 256)
	for i := range garbage {
		garbage[i] = byte(i*131 + 7)
	}
	return []Case{
		{"garbage", garbage},
		{"4 GiB lengths", bytes.Repeat([]byte{0xff}, 4096)}, // longer than any hello
		{"wrong secret", wrongSecret},
		{"stalled handshake", wrongSecret[:min(len(wrongSecret), 5)]},
		{"silent", nil},
	}
}

// Dropped dials addr, sends c's bytes and waits until the server closes
// the connection; an error when it is still open after within.
func Dropped(ctx context.Context, addr string, c Case, within time.Duration) error {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: dial %s: %w", c.Name, addr, err)
	}
	defer nc.Close()
	if err := nc.SetDeadline(time.Now().Add(within)); err != nil {
		return err
	}
	if len(c.Send) > 0 {
		if _, err := nc.Write(c.Send); err != nil {
			return nil // already dropped
		}
	}
	// The server may answer (a refusal) before it closes; read to the end.
	_, err = io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: the server kept the connection open for %v", c.Name, within)
	}
	return nil
}

// Burst runs n connections of c at once; each must be dropped within
// within.
func Burst(ctx context.Context, addr string, c Case, n int, within time.Duration) error {
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Dropped(ctx, addr, c, within)
		}()
	}
	wg.Wait()
	close(errs)
	var failed []error
	for err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("burst of %d: %d not dropped, the first: %w", n, len(failed), failed[0])
	}
	return nil
}

// Settle collects garbage and returns the live heap bytes and goroutines,
// waiting up to wait for the goroutines to fall to at most goroutines
// (0: do not wait).
func Settle(goroutines int, wait time.Duration) (heap uint64, n int) {
	deadline := time.Now().Add(wait)
	for {
		n = runtime.NumGoroutine()
		if goroutines == 0 || n <= goroutines || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, n
}

// FirstWrite runs client (a protocol's handshake) on one end of a pipe and
// returns the first bytes it writes: its hello, for replaying under
// another secret.
func FirstWrite(client func(nc net.Conn)) []byte {
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		client(a)
	}()
	buf := make([]byte, 64<<10)
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _ := b.Read(buf)
	b.Close()
	a.Close()
	<-done
	return buf[:n]
}
