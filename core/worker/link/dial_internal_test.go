package link

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Pauses double from 250 ms to at most 5 s, and the jitter only shortens
// them, by at most a quarter.
func TestRetryPause(t *testing.T) {
	cases := []struct {
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{1, 0, 250 * time.Millisecond},
		{2, 0, 500 * time.Millisecond},
		{3, 0, time.Second},
		{5, 0, 4 * time.Second},
		{6, 0, 5 * time.Second},
		{60, 0, 5 * time.Second},
		{1, 0.999, 250*time.Millisecond - 62437500},
		{60, 0.5, 5*time.Second - 625*time.Millisecond},
	}
	for _, c := range cases {
		if got := retryPause(c.attempt, c.rnd); got != c.want {
			t.Errorf("retryPause(%d, %v) = %v, want %v", c.attempt, c.rnd, got, c.want)
		}
	}
}

// A coordinator that refuses every attempt is reported as refusing, not
// as whatever the deadline cut short last.
func TestDialReportsTheLastRealError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused
	_, err = Dial(context.Background(), Config{Coordinator: addr, ConnectTimeout: 400 * time.Millisecond, Logger: hclog.NewNullLogger()})
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "gave up after 400ms") {
		t.Fatalf("error %v, want connection refused after the connect timeout", err)
	}
}
