package averager

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

func TestSettings(t *testing.T) {
	for _, tc := range []struct {
		in   string
		err  string
		want func(c config) bool
	}{
		{in: ``, want: func(c config) bool {
			return c.gamma == 1 && c.wire == reduce.WireF32 && c.alpha == 0 && c.timeout == 30*time.Second &&
				c.smoothing && c.outer == numeric.Outer{Kind: numeric.OuterSlowMo, LR: 1 - DefaultSmoothing, Mu: DefaultSmoothing}
		}},
		{in: `null`, want: func(c config) bool { return c.gamma == 1 }},
		{in: `{"gamma": 0.5, "wire": "bf16"}`, want: func(c config) bool { return c.gamma == 0.5 && c.wire == reduce.WireBF16 }},
		{in: `{"outer": "slowmo"}`, want: func(c config) bool {
			return !c.smoothing && c.outer == numeric.Outer{Kind: numeric.OuterSlowMo, LR: 1, Mu: 0.9}
		}},
		{in: `{"outer": "diloco"}`, want: func(c config) bool { return c.outer == numeric.Outer{Kind: numeric.OuterDiLoCo, LR: 0.7, Mu: 0.9} }},
		{in: `{"outer": "diloco", "outer_lr": 0.5, "outer_momentum": 0}`, want: func(c config) bool { return c.outer.LR == 0.5 && c.outer.Mu == 0 }},
		{in: `{"easgd_alpha": 0.5, "host": "rank", "threads": 3, "timeout": "2s"}`, want: func(c config) bool {
			return c.alpha == 0.5 && c.host == "rank" && c.threads == 3 && c.timeout == 2*time.Second
		}},
		{in: `{"gama": 1}`, err: `unknown key "gama"`},
		{in: `{"gamma": -1}`, err: "gamma"},
		{in: `{"wire": "f16"}`, err: "wire"},
		{in: `{"smoothing": 0.5}`, want: func(c config) bool {
			return c.smoothing && c.outer == numeric.Outer{Kind: numeric.OuterSlowMo, LR: 0.5, Mu: 0.5} && c.soloIdentity()
		}},
		{in: `{"smoothing": 0}`, want: func(c config) bool { return !c.smoothing && c.outer.Kind == numeric.OuterNone }},
		{in: `{"smoothing": 1}`, err: "smoothing = 1"},
		{in: `{"smoothing": -0.1}`, err: "smoothing = -0.1"},
		{in: `{"smoothing": 0.5, "outer": "diloco"}`, err: "not both"},
		{in: `{"outer": "adam"}`, err: "unknown outer optimizer"},
		{in: `{"outer_lr": 1}`, err: "need outer"},
		{in: `{"outer": "none"}`, want: func(c config) bool { return !c.smoothing && c.outer.Kind == numeric.OuterNone }},
		{in: `{"outer": "slowmo", "outer_momentum": 1}`, err: "outer_momentum"},
		{in: `{"easgd_alpha": 1.5}`, err: "easgd_alpha"},
		{in: `{"timeout": "forever"}`, err: "timeout"},
		{in: `{"threads": -1}`, err: "threads"},
		{in: `{} {}`, err: "trailing"},
		{in: `[1]`, err: "averager settings"},
	} {
		c, err := parseSettings([]byte(tc.in))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one containing %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case tc.err == "" && !tc.want(c):
			t.Errorf("%s: got %+v", tc.in, c)
		}
	}
	a, _ := parseSettings([]byte(`{"gamma": 1, "host": "rank", "threads": 2}`))
	b, _ := parseSettings([]byte(`{}`))
	if a.digest() != b.digest() {
		t.Error("host and threads are local: they must not change the cohort digest")
	}
	d, _ := parseSettings([]byte(`{"wire": "bf16"}`))
	if d.digest() == b.digest() {
		t.Error("the wire must change the digest")
	}
	// The same filter, but only smoothing leaves lone rounds alone: ranks
	// that disagree on that must not share a cohort.
	sm, _ := parseSettings([]byte(`{"smoothing": 0.5}`))
	sl, _ := parseSettings([]byte(`{"outer": "slowmo", "outer_lr": 0.5, "outer_momentum": 0.5}`))
	if sm.outer != sl.outer || sm.digest() == sl.digest() {
		t.Error("smoothing 0.5 must step as slowmo 0.5/0.5 and still differ from it in the digest")
	}
}

func TestConfigureErrors(t *testing.T) {
	c := newCohort(t, cohortOpts{world: 1})
	cfg := c.config(0, nil)
	for _, tc := range []struct {
		name string
		mod  func(cfg *plugin.AveragerConfig)
		err  string
	}{
		{"short key", func(c *plugin.AveragerConfig) { c.DataKey = []byte("x") }, "data key"},
		{"bad rank", func(c *plugin.AveragerConfig) { c.Rank = 5 }, "out of range"},
		{"no endpoint", func(c *plugin.AveragerConfig) { c.Endpoint = "" }, "endpoint"},
		{"bad settings", func(c *plugin.AveragerConfig) { c.Settings = []byte(`{"nope":1}`) }, "unknown key"},
		{"bad ring port", func(c *plugin.AveragerConfig) { c.Settings = []byte(`{"ring_port": 70000}`) }, "ring_port"},
		{"wrong key", func(c *plugin.AveragerConfig) {
			c.DataKey = []byte("another key, thirty-two bytes!!!")
			c.Settings = []byte(`{"connect_timeout": "1s"}`)
		}, "wrong data key is never answered"},
		{"wrong run", func(c *plugin.AveragerConfig) { c.RunID = "other" }, "another run"},
	} {
		x := cfg
		tc.mod(&x)
		_, err := New(nil).Configure(t.Context(), x)
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

func TestSpans(t *testing.T) {
	l, _ := arena.Pack([]arena.Entry{
		{Name: "b", DType: arena.F32, Shape: []int64{3}, Role: arena.Buffer},
		{Name: "w", DType: arena.F32, Shape: []int64{5}, Role: arena.Parameter},
		{Name: "steps", DType: arena.I64, Shape: []int64{1}, Role: arena.Buffer},
		{Name: "empty", DType: arena.F32, Shape: []int64{0}, Role: arena.Parameter},
	})
	spans, np, nb, err := buildSpans(l)
	if err != nil || np != 5 || nb != 3 || len(spans) != 2 || !spans[0].param || spans[0].idx != 0 || spans[1].idx != 5 || spans[1].off != 0 {
		t.Fatalf("spans %+v %d %d %v", spans, np, nb, err)
	}
	l, _ = arena.Pack([]arena.Entry{{Name: "half", DType: arena.BF16, Shape: []int64{4}, Role: arena.Parameter}})
	if _, _, _, err := buildSpans(l); err == nil || !strings.Contains(err.Error(), "f32 parameters only") {
		t.Fatalf("bf16 parameter: %v", err)
	}
}

// TestSmoothingForLayout: the default filter is off for an arena that
// carries the optimizer's momentum, and only the default: a filter or outer
// optimizer named in the settings stays.
func TestSmoothingForLayout(t *testing.T) {
	model := []arena.Entry{{Name: "fc.weight", DType: arena.F32, Role: arena.Parameter, Shape: []int64{4}}}
	withMoment := append(slices.Clone(model), arena.Entry{Name: "optimizer.exp_avg.fc.weight", DType: arena.F32, Role: arena.Buffer, Shape: []int64{4}})
	withBuffer := append(slices.Clone(model), arena.Entry{Name: "bn.running_mean", DType: arena.F32, Role: arena.Buffer, Shape: []int64{4}})
	for _, tc := range []struct {
		name     string
		settings string
		entries  []arena.Entry
		kind     numeric.OuterKind
		smooth   bool
	}{
		{"default, model only", `{}`, model, numeric.OuterSlowMo, true},
		{"default, a model buffer", `{}`, withBuffer, numeric.OuterSlowMo, true},
		{"default, the optimizer's momentum", `{}`, withMoment, numeric.OuterNone, false},
		{"smoothing named, the optimizer's momentum", `{"smoothing": 0.5}`, withMoment, numeric.OuterSlowMo, true},
		{"outer named, the optimizer's momentum", `{"outer": "diloco"}`, withMoment, numeric.OuterDiLoCo, false},
		{"smoothing 0, model only", `{"smoothing": 0}`, model, numeric.OuterNone, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := arena.Pack(tc.entries)
			if err != nil {
				t.Fatal(err)
			}
			c, err := parseSettings([]byte(tc.settings))
			if err != nil {
				t.Fatal(err)
			}
			c = c.forLayout(l)
			if c.outer.Kind != tc.kind || c.smoothing != tc.smooth {
				t.Fatalf("outer %v, smoothing %v; want %v, %v", c.outer.Kind, c.smoothing, tc.kind, tc.smooth)
			}
		})
	}
}
