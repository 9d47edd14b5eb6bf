package plugin_test

import (
	"math"
	"runtime"
	"slices"
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

// TestPickerReusesItsShuffle: a Picker hands out each epoch's slice of
// Permutation, and a new epoch's shuffle takes the last one's storage, so a
// run of many epochs allocates one permutation, not one an epoch.
func TestPickerReusesItsShuffle(t *testing.T) {
	const n, epochs = 100_000, 10
	var k plugin.Picker
	plan := func(epoch uint64) plugin.Plan {
		return plugin.Plan{Seed: 5, Epoch: epoch, PickSpace: n, PartitionOffset: n / 4, PartitionSize: n / 2}
	}
	for epoch := range uint64(3) {
		got, err := k.Picks(plan(epoch))
		if err != nil {
			t.Fatal(err)
		}
		if want := plugin.Permutation(5, epoch, n)[n/4 : n/4+n/2]; !slices.Equal(got, want) {
			t.Fatalf("epoch %d: the picks are not the permutation's slice", epoch)
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for epoch := range uint64(epochs) {
		if _, err := k.Picks(plan(100 + epoch)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got >= n*8 {
		t.Fatalf("%d epochs' picks allocated %d bytes, want less than one permutation's %d", epochs, got, n*8)
	}
}
