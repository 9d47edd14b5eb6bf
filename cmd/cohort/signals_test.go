package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// The stop watchdog gives up on a command only when the command was
// signalled (its context ended) and did not return within the grace.
func TestStopWatchdog(t *testing.T) {
	const grace = 200 * time.Millisecond
	for _, tc := range []struct {
		name      string
		signalled bool
		returnsIn time.Duration // when the work returns after the signal
		giveUp    bool
	}{
		{"stuck after a signal", true, 5 * grace, true},
		{"stops within the grace", true, grace / 10, false},
		{"never signalled", false, 2 * grace, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var gaveUp atomic.Bool
			gave := make(chan struct{})
			stop := stopWatchdog(ctx, grace, func() {
				gaveUp.Store(true)
				close(gave)
			})
			if tc.signalled {
				cancel()
			}
			select {
			case <-gave:
			case <-time.After(tc.returnsIn):
			}
			stop()
			if gaveUp.Load() != tc.giveUp {
				t.Fatalf("gave up %v, want %v", gaveUp.Load(), tc.giveUp)
			}
			stop() // a second stop is harmless
		})
	}
}
