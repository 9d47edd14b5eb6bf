package plugin_test

import (
	"math"
	"testing"

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
