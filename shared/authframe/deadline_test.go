package authframe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func TestDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	soon, cancel := context.WithDeadline(context.Background(), now.Add(time.Second))
	defer cancel()
	late, cancel2 := context.WithDeadline(context.Background(), now.Add(time.Hour))
	defer cancel2()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
		want    time.Time
	}{
		{"no timeout, no ctx deadline", context.Background(), 0, time.Time{}},
		{"negative timeout", context.Background(), -time.Second, time.Time{}},
		{"timeout only", context.Background(), time.Minute, now.Add(time.Minute)},
		{"ctx deadline only", soon, 0, now.Add(time.Second)},
		{"ctx sooner", soon, time.Minute, now.Add(time.Second)},
		{"timeout sooner", late, time.Minute, now.Add(time.Minute)},
	} {
		if got := Deadline(tc.ctx, now, tc.timeout); !got.Equal(tc.want) {
			t.Errorf("%s: Deadline = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCtxCause(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	passed, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel2()
	timeout := fmt.Errorf("read: %w", os.ErrDeadlineExceeded)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error
	}{
		{"deadline, ctx live", context.Background(), timeout, timeout},
		{"deadline, ctx cancelled", cancelled, timeout, context.Canceled},
		{"deadline, ctx deadline passed", passed, timeout, context.DeadlineExceeded},
		{"other error, ctx cancelled", cancelled, io.EOF, io.EOF},
	} {
		if got := CtxCause(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: CtxCause = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// WithDeadline bounds a blocked read by the timeout or by ctx, whichever
// ends first, and leaves no deadline behind on success.
func TestWithDeadline(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		timeout time.Duration
		want    error
	}{
		{"timeout", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }, 50 * time.Millisecond, os.ErrDeadlineExceeded},
		{"ctx deadline sooner", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, time.Minute, context.DeadlineExceeded},
		{"ctx cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			return ctx, cancel
		}, time.Minute, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			ctx, cancel := tc.ctx()
			defer cancel()
			t0 := time.Now()
			err := WithDeadline(ctx, a, tc.timeout, func() error {
				_, err := a.Read(make([]byte, 1))
				return CtxCause(ctx, err)
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if el := time.Since(t0); el > 5*time.Second {
				t.Fatalf("returned after %v", el)
			}
		})
	}
	t.Run("success clears the deadline", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if err := WithDeadline(context.Background(), a, 20*time.Millisecond, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(40 * time.Millisecond)
		go b.Write([]byte{1})
		if _, err := a.Read(make([]byte, 1)); err != nil {
			t.Fatalf("read after WithDeadline: %v (the deadline was left set)", err)
		}
	})
	t.Run("closed connection", func(t *testing.T) {
		a, b := net.Pipe()
		b.Close()
		a.Close()
		called := false
		err := WithDeadline(context.Background(), a, time.Second, func() error { called = true; return nil })
		if err == nil || called {
			t.Fatalf("WithDeadline on a closed connection: %v, f called %v", err, called)
		}
	})
}

// After stop returns, a ctx that ends no longer touches the deadline.
func TestInterruptOnStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	fired := make(chan struct{}, 1)
	stop := InterruptOn(ctx, func(time.Time) error { fired <- struct{}{}; return nil })
	stop()
	cancel()
	select {
	case <-fired:
		t.Fatal("interrupt fired after stop")
	case <-time.After(50 * time.Millisecond):
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer InterruptOn(ctx2, func(time.Time) error { fired <- struct{}{}; return nil })()
	cancel2()
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not fire when ctx ended")
	}
}

func TestIsEOF(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{{io.EOF, true}, {io.ErrUnexpectedEOF, true}, {fmt.Errorf("x: %w", io.EOF), true}, {os.ErrDeadlineExceeded, false}, {nil, false}} {
		if got := IsEOF(tc.err); got != tc.want {
			t.Errorf("IsEOF(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
