package link

import (
	"testing"
	"time"
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
