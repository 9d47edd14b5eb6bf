package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A round the averager gives up on for a recoverable reason must stay
// recognisable on the host, or the rank would exit instead of waiting for
// the group to re-form.
func TestRoundAbortedCrossesTheBoundary(t *testing.T) {
	cases := []struct {
		name        string
		err         error
		wantAborted bool
	}{
		{"aborted", fmt.Errorf("round 7: %w: rank 2 died", ErrRoundAborted), true},
		{"failed by backend", fmt.Errorf("%w: failed by the reduce server", ErrRoundAborted), true},
		{"plain failure", errors.New("round 7: arena layout changed"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := &recorder{err: c.err}
			a := serveAverager(t, &fakeAverager{call: rec.call})
			_, err := a.Average(context.Background(), Round{Round: 7, Steps: 1})
			if err == nil {
				t.Fatal("Average succeeded")
			}
			if got := errors.Is(err, ErrRoundAborted); got != c.wantAborted {
				t.Fatalf("errors.Is(%q, ErrRoundAborted) = %v, want %v", err, got, c.wantAborted)
			}
			if !strings.Contains(err.Error(), c.err.Error()) {
				t.Fatalf("host error %q lost the plugin's message %q", err, c.err)
			}
		})
	}
}
