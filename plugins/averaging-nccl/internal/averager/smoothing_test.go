package averager

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
)

// fillRound gives every rank new parameter values, as training between
// rounds would.
func (g *group) fillRound(round int) {
	for r := range g.avgs {
		v := g.values(r, 0)
		for k := range v {
			v[k] = float32(math.Cos(float64(round*37+r*11+k))) * float32(round+r+1)
		}
		g.setValues(r, 0, v)
	}
}

// layouts are the ways a mean runs: every rank on a GPU of its own
// (weights all-reduced by NCCL) or ranks sharing one (weights through the
// relay, the fold on the device), with the parameters staged through the
// host arena or kept on the device by the trainer.
var layouts = []struct {
	name  string
	group func(t *testing.T, world int, settings string) *group
}{
	{"own GPUs", newGroup},
	{"one shared GPU", func(t *testing.T, world int, settings string) *group {
		return newGroupOn(t, world, settings, 1, func(int) string { return "h0" })
	}},
	{"own GPUs, parameters on them", func(t *testing.T, world int, settings string) *group {
		return newDeviceGroup(t, world, settings, 1, func(r int) string { return fmt.Sprintf("h%d", r) })
	}},
	{"one shared GPU, parameters on it", func(t *testing.T, world int, settings string) *group {
		return newDeviceGroup(t, world, settings, 1, func(int) string { return "h0" })
	}},
}

// TestSmoothing: with smoothing, each round's parameters are the plain
// consensus filtered as averaging-cpu filters it (slow momentum, lr 1−s,
// momentum s, seeded by the first round), computed here in float64, and
// identical on every rank; buffers stay the plain mean.
func TestSmoothing(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) { testSmoothing(t, l.group(t, 3, `{"smoothing": 0.5}`)) })
	}
}

func testSmoothing(t *testing.T, g *group) {
	const s = 0.5
	steps := []uint64{1, 2, 3}
	var prev, vel []float64
	for round := 1; round <= 4; round++ {
		g.fillRound(round)
		pre := g.snapshot()
		g.mustAverage(g.all(), uint64(round), steps)
		// The plain consensus of the parameters, then the filter.
		n := len(pre[0][0])
		want := make([]float64, n)
		for k := range n {
			var sum, total float64
			for r := range g.avgs {
				sum += float64(steps[r]) * float64(pre[r][0][k])
				total += float64(steps[r])
			}
			want[k] = sum / total
		}
		if prev == nil {
			prev, vel = append([]float64(nil), want...), make([]float64, n)
		} else {
			for k := range want {
				vel[k] = s*vel[k] + (prev[k] - want[k])
				want[k] = prev[k] - (1-s)*vel[k]
				prev[k] = want[k]
			}
		}
		rank0 := g.values(0, 0)
		for r := range g.avgs {
			got := g.values(r, 0)
			for k := range want {
				if math.Abs(float64(got[k])-want[k]) > 1e-5*(1+math.Abs(want[k])) {
					t.Fatalf("round %d rank %d [%d] = %v, want %v", round, r, k, got[k], want[k])
				}
				if got[k] != rank0[k] {
					t.Fatalf("round %d: ranks 0 and %d differ at [%d]", round, r, k)
				}
			}
		}
		if round == 1 {
			g.checkMean(g.all(), g.all(), pre, steps, 1) // the seed round: the plain mean
		}
	}
}

// A rank whose filter state is fresh (its plugin replaced) makes every rank
// reseed from that round's consensus, so they stay equal.
func TestSmoothingReseedsWhenStatesDiffer(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) { testSmoothingReseeds(t, l.group(t, 2, `{"smoothing": 0.5}`)) })
	}
}

func testSmoothingReseeds(t *testing.T, g *group) {
	steps := []uint64{1, 1}
	for round := 1; round <= 3; round++ {
		g.fillRound(round)
		g.mustAverage(g.all(), uint64(round), steps)
	}
	g.avgs[1].smooth.steps = 0 // as a replaced averager starts
	g.fillRound(4)
	pre := g.snapshot()
	g.mustAverage(g.all(), 4, steps)
	g.checkMean(g.all(), g.all(), pre, steps, 1) // a seed round leaves the plain mean
	if a, b := g.avgs[0].smooth.steps, g.avgs[1].smooth.steps; a != 1 || b != 1 {
		t.Fatalf("step counts after the reseed: %d and %d, want 1 and 1", a, b)
	}
}

// Ranks configured with different smoothing refuse the round, naming it.
func TestSmoothingSettingsMustAgree(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) { testSmoothingSettingsMustAgree(t, l.group(t, 2, `{"smoothing": 0.5}`)) })
	}
}

func testSmoothingSettingsMustAgree(t *testing.T, g *group) {
	errs := g.each(g.all(), func(ctx context.Context, r int) error {
		set := `{"smoothing": 0.5}`
		if r == 1 {
			set = `{"smoothing": 0.25}`
		}
		_, err := g.avgs[r].Configure(ctx, plugin.AveragerConfig{Rank: uint32(r), WorldSize: 2,
			Arena: g.desc(r), Settings: []byte(set), Relay: g.relay.Relay(uint32(r))})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Configure rank %d: %v", r, err)
		}
	}
	for r, err := range g.average(g.all(), 1, []uint64{1, 1}) {
		if err == nil || !strings.Contains(err.Error(), "smoothing settings differ") {
			t.Errorf("rank %d: %v, want the smoothing settings named", r, err)
		}
	}
}

// A lone member's round leaves its arena bit for bit, smoothing or not.
func TestSmoothingLoneRound(t *testing.T) {
	g := newGroup(t, 1, `{"smoothing": 0.5}`)
	for round := 1; round <= 3; round++ {
		g.fillRound(round)
		pre := g.values(0, 0)
		g.mustAverage(g.all(), uint64(round), []uint64{2})
		for k, x := range g.values(0, 0) {
			if math.Float32bits(x) != math.Float32bits(pre[k]) {
				t.Fatalf("round %d changed a lone rank's [%d]: %v → %v", round, k, pre[k], x)
			}
		}
	}
}

func TestSmoothingSettings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  string
	}{
		{`{}`, 0.5, ""},
		{`{"smoothing": 0}`, 0, ""},
		{`{"smoothing": 0.9}`, 0.9, ""},
		{`{"smoothing": 1}`, 0, "smoothing = 1"},
		{`{"smoothing": -0.5}`, 0, "smoothing = -0.5"},
	} {
		c, err := parseSettings([]byte(tc.in))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error naming %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || c.smoothing != tc.want):
			t.Errorf("%s: smoothing %v, %v; want %v", tc.in, c.smoothing, err, tc.want)
		}
	}
}

// FuzzSmoothingState: decoding any bytes errs or restores a state that
// encodes back to them; it never panics.
func FuzzSmoothingState(f *testing.F) {
	m := newSmoother(0.5, 3)
	m.prev[1], m.vel[2], m.steps = 1.5, -2, 7
	f.Add(m.encode())
	f.Add([]byte("cohort-nccl-smoothing-v1\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d := newSmoother(0.5, 3)
		if err := d.decode(b); err != nil {
			return
		}
		if string(d.encode()) != string(b) {
			t.Fatalf("decoded state encodes to other bytes")
		}
	})
}

// TestHostCopyBytes: a round reports the parameter bytes it copied
// between host and device: the staging buffer both ways for a mean and a
// broadcast's root, one way for the other ranks of a broadcast, none for
// a lone member.
func TestHostCopyBytes(t *testing.T) {
	g := newGroup(t, 2, `{}`)
	staging := uint64(len(g.avgs[0].staging))
	results := func(rq func(r int) plugin.Round) map[int]plugin.RoundResult {
		out := map[int]plugin.RoundResult{}
		var mu sync.Mutex
		for r, err := range g.each(g.all(), func(ctx context.Context, r int) error {
			res, err := g.avgs[r].Average(ctx, rq(r))
			mu.Lock()
			out[r] = res
			mu.Unlock()
			return err
		}) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		return out
	}
	for r, res := range results(func(int) plugin.Round { return plugin.Round{Round: 1, Steps: 1} }) {
		if res.HostCopyBytes != 2*staging {
			t.Errorf("mean, rank %d: %d host copy bytes, want %d", r, res.HostCopyBytes, 2*staging)
		}
	}
	for r, res := range results(func(int) plugin.Round { return plugin.Round{Round: 2, Broadcast: true, Root: 1} }) {
		want := staging
		if r == 1 {
			want = 2 * staging
		}
		if res.HostCopyBytes != want {
			t.Errorf("broadcast, rank %d: %d host copy bytes, want %d", r, res.HostCopyBytes, want)
		}
	}
	lone := newGroup(t, 1, `{}`)
	res, err := lone.avgs[0].Average(context.Background(), plugin.Round{Round: 1, Steps: 3})
	if err != nil || res.HostCopyBytes != 0 {
		t.Errorf("lone member: %d host copy bytes, %v; want none", res.HostCopyBytes, err)
	}
}

// With the trainers' parameters on the device, no round copies any to or
// from the host, and the arenas' f32 entries stay as the trainers left
// them (stale, here zero), in either layout, smoothing included.
func TestParametersStayOnTheDevice(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			host := func(r int) string { return fmt.Sprintf("h%d", r) }
			if shared {
				host = func(int) string { return "h0" }
			}
			g := newDeviceGroup(t, 3, `{}`, 1, host)
			for round, rq := range []func(r int) plugin.Round{
				func(int) plugin.Round { return plugin.Round{Round: 1, Broadcast: true, Root: 2} },
				func(r int) plugin.Round { return plugin.Round{Round: 2, Steps: uint64(r + 1)} },
				func(r int) plugin.Round { return plugin.Round{Round: 3, Steps: uint64(r + 1)} },
			} {
				for r, err := range g.each(g.all(), func(ctx context.Context, r int) error {
					res, err := g.avgs[r].Average(ctx, rq(r))
					if err == nil && (res.HostCopyBytes != 0 || !res.Realized || !(res.PostNorm > 0)) {
						err = fmt.Errorf("round %d: %+v; want realized, a norm, no host copies", round+1, res)
					}
					return err
				}) {
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
			}
			g.checkEqual()
			for r := range g.avgs {
				for entry := range 2 {
					v, _ := g.arenas[r].Float32s(entry)
					if slices.ContainsFunc(v, func(x float32) bool { return x != 0 }) {
						t.Fatalf("rank %d's arena entry %d was written: %v", r, entry, v)
					}
				}
			}
		})
	}
}

// The filter's state survives a checkpoint wherever it lives: averagers
// that load what others saved after two rounds give the third round's
// parameters bit for bit as those others do. (On the device, the state is
// read off it to save and written back to load.)
func TestSmoothingStateSurvivesACheckpoint(t *testing.T) {
	const settings = `{"smoothing": 0.5}`
	steps := []uint64{1, 2, 3}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			ran, fresh := l.group(t, 3, settings), l.group(t, 3, settings)
			for round := 1; round <= 2; round++ {
				ran.fillRound(round)
				ran.mustAverage(ran.all(), uint64(round), steps)
			}
			for r := range ran.avgs {
				dir := t.TempDir()
				if _, err := ran.avgs[r].SaveState(context.Background(), dir); err != nil {
					t.Fatal(err)
				}
				if err := fresh.avgs[r].LoadState(context.Background(), dir); err != nil {
					t.Fatal(err)
				}
			}
			for _, g := range []*group{ran, fresh} {
				g.fillRound(3)
				g.mustAverage(g.all(), 3, steps)
			}
			for r := range ran.avgs {
				if want, got := ran.values(r, 0), fresh.values(r, 0); !slices.Equal(got, want) {
					t.Fatalf("rank %d after loading: %v, want %v", r, got, want)
				}
			}
		})
	}
}
