package plugin_test

import (
	"math"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

func TestPlanLRMultiplier(t *testing.T) {
	for _, tc := range []struct {
		scale, want float64
		ok          bool
	}{
		{0, 1, true},
		{0.5, 0.5, true},
		{3, 3, true},
		{-1, 0, false},
		{math.NaN(), 0, false},
		{math.Inf(1), 0, false},
		{math.Inf(-1), 0, false},
	} {
		got, err := plugin.Plan{LRScale: tc.scale}.LRMultiplier()
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("LRScale %v: %v, %v; want %v (ok %v)", tc.scale, got, err, tc.want, tc.ok)
		}
	}
}

// Reports carry times to the microsecond and beyond, not cut to whole
// milliseconds as time.Duration.Milliseconds would.
func TestMilliseconds(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want float64
	}{
		{0, 0},
		{1500 * time.Microsecond, 1.5},
		{250 * time.Nanosecond, 0.00025},
		{3 * time.Second, 3000},
	}
	for _, c := range cases {
		if got := plugin.Milliseconds(c.d); got != c.want {
			t.Errorf("Milliseconds(%v) = %v, want %v", c.d, got, c.want)
		}
	}
}
