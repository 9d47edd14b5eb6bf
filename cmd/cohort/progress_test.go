package main

import "testing"

// The console counts in words: one rank, four ranks.
func TestCount(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{{0, "0 epochs"}, {1, "1 epoch"}, {2, "2 epochs"}} {
		if got := count(tc.n, "epoch"); got != tc.want {
			t.Errorf("count(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
