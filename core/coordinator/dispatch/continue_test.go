package dispatch

import (
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
)

// A coordinator that came back hands out again the window the lost one
// had handed out after the consensus, less what each rank kept of it:
// that is the rank's unaveraged work, and the rest of its plan its next
// plan. Work kept anywhere but at the start of the rank's plan (or under
// a policy that does not partition the epoch) is refused, and the
// dispatcher is left as it was.
func TestContinueWindow(t *testing.T) {
	type want struct {
		plans map[uint32]Range // each rank's plan; absent: none
		since uint64           // Unsynced
	}
	span := func(epoch, off, size uint64) Span {
		return Span{Epoch: epoch, Range: Range{Offset: off, Size: size}, Batches: (size + 9) / 10}
	}
	for _, tc := range []struct {
		name   string
		policy config.Policy
		held   map[uint32][]Span
		want   *want // nil: refused
	}{
		{name: "nothing kept", held: nil,
			want: &want{plans: map[uint32]Range{0: {0, 40}, 1: {500, 40}}}},
		{name: "part of one plan, all of the other", held: map[uint32][]Span{0: {span(1, 0, 20)}, 1: {span(1, 500, 40)}},
			want: &want{plans: map[uint32]Range{0: {20, 20}}, since: 6}},
		{name: "the start of a plan, in two reports' spans", held: map[uint32][]Span{0: {span(1, 0, 10), span(1, 10, 20)}},
			want: &want{plans: map[uint32]Range{0: {30, 10}, 1: {500, 40}}, since: 3}},
		{name: "beyond the window", held: map[uint32][]Span{0: {span(1, 0, 50)}}},
		{name: "not at the plan's start", held: map[uint32][]Span{0: {span(1, 10, 20)}}},
		{name: "with a gap", held: map[uint32][]Span{0: {span(1, 0, 10), span(1, 20, 10)}}},
		{name: "of another epoch", held: map[uint32][]Span{1: {span(0, 500, 20)}}},
		{name: "a pooled policy", policy: config.PolicyCadence, held: map[uint32][]Span{0: {span(1, 0, 20)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Run.Ranks = 2
			if tc.policy != "" {
				cfg.Coordinator.Policy = tc.policy
			}
			d := New(cfg, hclog.NewNullLogger())
			d.Form(1000, 10, false, nil)
			live := []uint32{0, 1}
			d.Resume(Resumed{Epoch: 1, Remaining: []RankRanges{{Rank: 0, Ranges: []Range{{0, 500}}}, {Rank: 1, Ranges: []Range{{500, 500}}}}}, live)
			d.RestoreController(nil, &ControllerWindow{Interval: 4, LRScale: 1})
			plans, ok := d.ContinueWindow(live, tc.held)
			if tc.want == nil {
				if ok || plans != nil {
					t.Fatalf("ContinueWindow = %v, %v; want it refused", plans, ok)
				}
				// Nothing changed: the window is still to hand out in full
				// (from the pool, as the cadence sizes it, under cadence).
				plans = d.NextPlans(live)
				whole := len(plans) == 2 && (tc.policy != "" || plans[0].rng == Range{0, 40} && plans[1].rng == Range{500, 40})
				if d.Unsynced(live) != 0 || len(d.Held(0))+len(d.Held(1)) != 0 || !whole {
					t.Errorf("after the refusal: plans %v, unsynced %d, held %v %v; want the whole window, nothing trained", plans, d.Unsynced(live), d.Held(0), d.Held(1))
				}
				return
			}
			if !ok {
				t.Fatal("ContinueWindow refused")
			}
			if len(plans) != len(tc.want.plans) {
				t.Fatalf("plans %v, want %v", plans, tc.want.plans)
			}
			for id, rg := range tc.want.plans {
				p := plans[id]
				if p == nil || p.rng != rg || d.EpochPlan(p).GetEpoch() != 1 {
					t.Errorf("rank %d's plan %+v, want %v of epoch 1", id, p, rg)
				}
				if d.Outstanding(id) != 1 {
					t.Errorf("rank %d holds %d open plans, want 1", id, d.Outstanding(id))
				}
			}
			for _, id := range live {
				if _, has := tc.want.plans[id]; !has && d.Outstanding(id) != 0 {
					t.Errorf("rank %d holds %d open plans, want none: it trained its whole window", id, d.Outstanding(id))
				}
				if got, kept := len(d.Held(id)), len(tc.held[id]); got != kept {
					t.Errorf("rank %d: %d unaveraged spans, want its %d kept ones", id, got, kept)
				}
			}
			if got := d.Unsynced(live); got != tc.want.since {
				t.Errorf("unsynced %d batches, want %d: the window's round averages the kept work", got, tc.want.since)
			}
			if got := d.GlobalStep(); got != tc.want.since/2 {
				t.Errorf("global step %d, want %d", got, tc.want.since/2)
			}
		})
	}
}
