package main

import (
	"testing"

	"github.com/cohortdl/cohort/internal/testutil/proctab"
)

// The soak samples at epoch ends only, never at a progress line.
func TestEpochLine(t *testing.T) {
	for _, c := range []struct {
		line  string
		epoch string
	}{
		{"epoch 10/200  loss 0.3001  eval loss 0.3377  accuracy 87.84%  60000 samples", "10"},
		{"epoch 7/12   loss 0.4  60000 samples", "7"},
		{"epoch 10/200    7%  4416/60000 samples  15091 samples/s  ETA 4s  loss 0.2218", ""},
		{"cohort formed: 4 ranks in 0.8s", ""},
	} {
		m := epochLine.FindStringSubmatch(c.line)
		if got := ""; m != nil {
			got = m[1]
			if got != c.epoch {
				t.Errorf("%q: epoch %q, want %q", c.line, got, c.epoch)
			}
		} else if c.epoch != "" {
			t.Errorf("%q: no match, want epoch %s", c.line, c.epoch)
		}
	}
}

// Each process of a run is named by its role and rank.
func TestName(t *testing.T) {
	ps := []proctab.Proc{
		{PID: 10, PPID: 1, Args: []string{"bin/cohort", "run"}},
		{PID: 11, PPID: 10, Args: []string{"/r/bin/cohort", "worker", "--coordinator", "127.0.0.1:5", "--rank", "2", "--world", "4"}},
		{PID: 12, PPID: 11, Args: []string{"/r/bin/plugins/cohort-trainer-libtorch"}},
		{PID: 13, PPID: 10, Args: []string{"/usr/bin/stray"}},
	}
	for i, want := range []string{"cohort run", "rank 2 worker", "rank 2 cohort-trainer-libtorch", "stray (13)"} {
		if got := name(ps, ps[i], 10); got != want {
			t.Errorf("process %d: %q, want %q", ps[i].PID, got, want)
		}
	}
}

// The gate reads a trend: a steady leak fails it, while noise between
// samples and a single low first sample do not.
func TestTrend(t *testing.T) {
	epochs := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = float64(10 + i)
		}
		return x
	}
	flat := make([]float64, 191)
	leak := make([]float64, 191)
	noisy := make([]float64, 191)
	lowFirst := make([]float64, 191)
	for i := range flat {
		flat[i] = 7400
		leak[i] = 7400 + 2.5*float64(i) // 0.33 kB an epoch: +6.4% over 190 epochs
		noisy[i] = 7400 + []float64{-300, 200, 100, -150, 300}[i%5]
		lowFirst[i] = 7500
	}
	lowFirst[0] = 7100
	for _, c := range []struct {
		name     string
		y        []float64
		min, max float64
	}{
		{"flat", flat, 0, 0},
		{"a steady leak", leak, 0.06, 0.07},
		{"noise around a level", noisy, -0.02, 0.02},
		{"a low first sample", lowFirst, -0.02, 0.02},
	} {
		if g, _ := trend(epochs(len(c.y)), c.y); g < c.min || g > c.max {
			t.Errorf("%s: growth %.4f, want within [%.2f, %.2f]", c.name, g, c.min, c.max)
		}
	}
	if _, rise := trend(epochs(len(leak)), leak); rise < 470 || rise > 480 {
		t.Errorf("a steady leak of 2.5 kB an epoch: rise %.1f kB over 190 epochs, want 475", rise)
	}
	if g, _ := trend([]float64{10}, []float64{1}); g != 0 {
		t.Errorf("one sample: growth %v, want 0", g)
	}
}
