package dispatch

import (
	"math"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
)

func ctlConfig(mut func(*config.Coordinator)) config.Coordinator {
	co := config.Default().Coordinator
	co.SyncEvery = 8
	if mut != nil {
		mut(&co)
	}
	return co
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// The controller's rules, fed one mean divergence per round (target 0.05
// unless the case says otherwise): what it decides and where it ends.
func TestControllerRules(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   func(*config.Coordinator)
		divs  []float64
		rules []string
		// interval and lr are the state after the rounds.
		interval uint64
		lr       float64
	}{
		{name: "inside the band nothing moves", divs: repeat(0.05, 40), interval: 8, lr: 1},
		{name: "drift halves the interval after the cooldown, down to the minimum",
			divs: repeat(0.2, 30), rules: []string{RuleTighten, RuleTighten, RuleTighten}, interval: 1, lr: 1},
		{name: "the minimum holds", cfg: func(c *config.Coordinator) { c.SyncEveryMin = 4 },
			divs: repeat(0.2, 30), rules: []string{RuleTighten}, interval: 4, lr: 1},
		{name: "by default calm rounds do not relax it past sync_every",
			divs: repeat(0.001, 60), interval: 8, lr: 1},
		{name: "calm rounds relax it by half, up to sync_every_max", cfg: func(c *config.Coordinator) { c.SyncEveryMax = 32 },
			divs: repeat(0.001, 60), rules: []string{RuleRelax, RuleRelax, RuleRelax, RuleRelax}, interval: 32, lr: 1},
		{name: "after a tightening calm rounds relax it back to sync_every",
			divs: append(repeat(0.2, 8), repeat(0.001, 60)...), rules: []string{RuleTighten, RuleTighten, RuleTighten, RuleRelax, RuleRelax, RuleRelax, RuleRelax}, interval: 8, lr: 1},
		{name: "an explicit maximum holds", cfg: func(c *config.Coordinator) { c.SyncEveryMax = 12 },
			divs: repeat(0.001, 60), rules: []string{RuleRelax}, interval: 12, lr: 1},
		{name: "calm must last: a drifting round in between resets the count",
			divs: []float64{0.001, 0.001, 0.001, 0.001, 0.2, 0.001, 0.001, 0.001}, interval: 8, lr: 1},
		{name: "adaptive off: drift changes nothing", cfg: func(c *config.Coordinator) { c.AdaptiveSync = false; c.GuardFactor = 0 },
			divs: repeat(0.5, 30), interval: 8, lr: 1},
		{name: "a spike trips the guard: minimum interval, half the rate",
			divs: append(repeat(0.04, 8), 0.5), rules: []string{RuleGuard}, interval: 1, lr: 0.5},
		{name: "the guard releases the rate after five settled rounds, and adaptation resumes",
			divs:  append(append(repeat(0.04, 8), 0.5), repeat(0.04, 5+cooldownRounds+calmRounds)...),
			rules: []string{RuleGuard, RuleGuardRelease}, interval: 1, lr: 1},
		{name: "no guard in the first rounds: a jump at the start is drift, not a spike",
			divs: []float64{0.04, 0.04, 0.5}, rules: []string{RuleTighten}, interval: 4, lr: 1},
		{name: "guard off: the spike is drift", cfg: func(c *config.Coordinator) { c.GuardFactor = 0 },
			divs: append(repeat(0.04, 8), 0.5), rules: []string{RuleTighten}, interval: 4, lr: 1},
		{name: "non-finite and negative divergences are ignored",
			divs: []float64{math.NaN(), math.Inf(1), -1, 0.05}, interval: 8, lr: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rules []string
			c := newController(ctlConfig(tc.cfg), func(d ControllerDecision) { rules = append(rules, d.Rule) })
			for i, d := range tc.divs {
				c.observeRound(uint64(i+1), 1, []float64{d, d})
			}
			if !slices.Equal(rules, tc.rules) {
				t.Errorf("decisions %v, want %v", rules, tc.rules)
			}
			if w := c.window(); w.Interval != tc.interval || w.LRScale != tc.lr {
				t.Errorf("window %+v, want interval %d, lr scale %g", w, tc.interval, tc.lr)
			}
			if s := c.summary(); len(s.Decisions) != len(tc.rules) {
				t.Errorf("summary lists %d decisions, the log %d", len(s.Decisions), len(tc.rules))
			}
		})
	}
}

// The default target follows the optimizer the ranks report at formation
// (the dispatcher's Form), and a target the config names holds whatever
// the optimizer. The divergence the transformer of `make bench` reads
// under AdamW (about 0.022) tightens the interval only where it is the
// adaptive default's.
func TestControllerTargetForOptimizer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		target   float64 // the config's
		adaptive bool
		want     float64
		rules    []string
	}{
		{name: "SGD, default", want: DivergenceTarget},
		{name: "adaptive, default", adaptive: true, want: AdaptiveDivergenceTarget, rules: []string{RuleTighten, RuleTighten}},
		{name: "adaptive, the config's target", target: 0.05, adaptive: true, want: 0.05},
		{name: "SGD, the config's target", target: 0.01, want: 0.01, rules: []string{RuleTighten, RuleTighten}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rules []string
			d := New(&config.Config{Run: config.Run{Ranks: 2}, Coordinator: ctlConfig(func(c *config.Coordinator) { c.DivergenceTarget = tc.target })}, hclog.NewNullLogger())
			d.ctl.log = func(c ControllerDecision) { rules = append(rules, c.Rule) }
			d.Form(1000, 10, tc.adaptive, nil)
			for i := range 2 * (cooldownRounds + 1) {
				d.ctl.observeRound(uint64(i+1), 1, []float64{0.022, 0.022})
			}
			s := d.ctl.summary()
			if s.DivergenceTarget != tc.want {
				t.Errorf("target %g, want %g", s.DivergenceTarget, tc.want)
			}
			if !slices.Equal(rules, tc.rules) {
				t.Errorf("decisions %v, want %v", rules, tc.rules)
			}
		})
	}
}

// The plateau rule scales the rate after patience epochs without a better
// eval loss, and only then; the guard's factor multiplies on top.
func TestControllerPlateau(t *testing.T) {
	for _, tc := range []struct {
		name     string
		patience int
		losses   []float64
		lr       float64
		plateaus int
	}{
		{"off", 0, []float64{1, 1, 1, 1}, 1, 0},
		{"improving", 2, []float64{1, 0.9, 0.8, 0.7}, 1, 0},
		{"two flat epochs", 2, []float64{1, 1, 1}, 0.5, 1},
		{"a tiny gain is no gain", 1, []float64{1, 0.99999}, 0.5, 1},
		{"the count restarts after a cut", 2, []float64{1, 1, 1, 1}, 0.5, 1},
		{"twice", 1, []float64{1, 1, 1}, 0.25, 2},
		{"NaN is skipped", 1, []float64{1, math.NaN()}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newController(ctlConfig(func(co *config.Coordinator) { co.LRPlateauPatience = tc.patience }), nil)
			for i, l := range tc.losses {
				c.observeEval(0, uint64(i+1), l)
			}
			if got := c.lrScale(); got != tc.lr {
				t.Errorf("lr scale %g, want %g", got, tc.lr)
			}
			if n := len(c.summary().Decisions); n != tc.plateaus {
				t.Errorf("%d plateau decisions, want %d", n, tc.plateaus)
			}
		})
	}
	c := newController(ctlConfig(func(co *config.Coordinator) { co.LRPlateauPatience = 1 }), nil)
	c.observeEval(0, 1, 1)
	c.observeEval(0, 2, 1)
	c.st.Guard = true
	if got := c.lrScale(); got != 0.25 {
		t.Errorf("plateau 0.5 under the guard's 0.5: lr scale %g, want 0.25", got)
	}
}

// A resumed controller hands its first window what the original run
// handed after the save point, then continues from the saved state; a
// state outside a changed config's bounds is clamped.
func TestControllerRestore(t *testing.T) {
	orig := newController(ctlConfig(nil), nil)
	for i, d := range repeat(0.2, 6) {
		orig.observeRound(uint64(i+1), 1, []float64{d})
	}
	first := ControllerWindow{Interval: 8, LRScale: 1}
	st := orig.state()

	c := newController(ctlConfig(nil), nil)
	c.restore(&st, &first)
	if w := c.window(); w != first {
		t.Fatalf("first window %+v, want the saved %+v", w, first)
	}
	c.handed()
	if w := c.window(); w.Interval != st.Interval {
		t.Fatalf("after the first window: interval %d, want the saved state's %d", w.Interval, st.Interval)
	}
	orig.observeRound(7, 1, []float64{0.2})
	c.observeRound(7, 1, []float64{0.2})
	if c.state() != orig.state() {
		t.Errorf("resumed state %+v, original %+v", c.state(), orig.state())
	}

	narrow := newController(ctlConfig(func(co *config.Coordinator) { co.SyncEveryMin = 6 }), nil)
	narrow.restore(&ControllerState{Interval: 1, PlateauScale: math.NaN()}, &ControllerWindow{LRScale: math.Inf(1)})
	if w := narrow.window(); w.Interval != 6 || w.LRScale != 1 {
		t.Errorf("clamped window %+v, want interval 6 and lr scale 1", w)
	}
}
