package coordinator

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// handedPlans lists the plans a rank was handed, in order, from every
// command that carries one.
func handedPlans(f *fakeRank) []*wirepb.EpochPlan {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*wirepb.EpochPlan
	for _, m := range f.received {
		switch m := m.(type) {
		case *wirepb.StartEpoch:
			out = append(out, m.GetPlan())
		case *wirepb.Sync:
			if m.GetNextPlan() != nil {
				out = append(out, m.GetNextPlan())
			}
		case *wirepb.Update:
			if m.GetNextPlan() != nil {
				out = append(out, m.GetNextPlan())
			}
		}
	}
	return out
}

// Ranks that drift past the divergence target get smaller windows, round
// by round down to the minimum; every sample is still trained once, and
// the summary lists the decisions.
func TestAdaptiveSyncTightensOnDrift(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.SyncEvery = 4
	cfg.Coordinator.DivergenceTarget = 0.01
	cfg.Coordinator.GuardFactor = 0
	const samples, batch = 960, 8
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(uint32) rankScript {
		return rankScript{msPerBatch: time.Millisecond, samples: samples,
			divergence: func(uint64) float64 { return 0.1 }}
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, samples)

	rules := decisionRules(sum.Controller)
	if want := []string{dispatch.RuleTighten, dispatch.RuleTighten}; !slices.Equal(rules, want) {
		t.Fatalf("decisions %v, want %v (4 → 2 → 1)", rules, want)
	}
	if sum.Controller.Interval != 1 {
		t.Errorf("final interval %d, want 1", sum.Controller.Interval)
	}
	// The status page sees the same: the interval in force and both moves.
	live := h.coord.Status().Controller
	if live.Interval != 1 || len(live.Decisions) != 2 || live.Decisions[1].Rule != dispatch.RuleTighten || live.Decisions[1].To != 1 || !live.Adaptive {
		t.Errorf("status controller %+v, want interval 1 after two tightenings", live)
	}
	for _, f := range ranks {
		plans := handedPlans(f)
		if len(plans) == 0 {
			t.Fatalf("rank %d got no plans", f.id)
		}
		first, last := plans[0].GetPartitionSize(), plans[len(plans)-1].GetPartitionSize()
		if first != 4*batch || last != batch {
			t.Errorf("rank %d: first plan %d samples, last %d; want %d then %d", f.id, first, last, 4*batch, batch)
		}
	}
}

// With no divergence_target in the config, ranks whose trainer reports an
// adaptive optimizer are held to the tighter default: a divergence that
// SGD's default leaves alone halves their interval twice, and the summary
// names the target the run used.
func TestAdaptiveOptimizerTightensByDefault(t *testing.T) {
	for _, adaptive := range []bool{false, true} {
		cfg := testConfig(t)
		cfg.Coordinator.SyncEvery = 4
		cfg.Coordinator.GuardFactor = 0
		const samples = 960
		h := newHarness(t, cfg, nil)
		h.startAll(func(uint32) rankScript {
			return rankScript{msPerBatch: time.Millisecond, samples: samples, adaptive: adaptive,
				divergence: func(uint64) float64 { return 0.022 }}
		})
		sum := h.mustComplete()
		h.ledger.checkExactlyOnce(t, 2, samples)
		want, rules := dispatch.DivergenceTarget, []string(nil)
		if adaptive {
			want, rules = dispatch.AdaptiveDivergenceTarget, []string{dispatch.RuleTighten, dispatch.RuleTighten}
		}
		if got := decisionRules(sum.Controller); !slices.Equal(got, rules) {
			t.Errorf("adaptive %v: decisions %v, want %v", adaptive, got, rules)
		}
		if sum.Controller.DivergenceTarget != want {
			t.Errorf("adaptive %v: summary target %g, want %g", adaptive, sum.Controller.DivergenceTarget, want)
		}
	}
}

// A divergence spike trips the guard: from the next window every rank's
// plans carry half the learning rate, all from the same round; once the
// divergence settles the rate is restored, again for every rank at once.
func TestGuardScalesEveryRanksRate(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.SyncEvery = 2
	cfg.Coordinator.AdaptiveSync = false
	const samples = 960
	const spike = 8
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(uint32) rankScript {
		return rankScript{msPerBatch: time.Millisecond, samples: samples,
			divergence: func(r uint64) float64 {
				if r == spike {
					return 0.5
				}
				return 0.02
			}}
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, samples)
	rules := decisionRules(sum.Controller)
	if want := []string{dispatch.RuleGuard, dispatch.RuleGuardRelease}; !slices.Equal(rules, want) {
		t.Fatalf("decisions %v, want %v", rules, want)
	}
	if d := sum.Controller.Decisions[0]; d.Round != spike || d.LRTo != 0.5 || d.To != 1 {
		t.Errorf("guard decision %+v, want round %d, lr scale 0.5, interval 1", d, spike)
	}
	// The scales each rank's plans carried, in order, as runs of equal
	// values: 1, then 0.5, then 1.
	var want []float64
	for _, f := range ranks {
		var runs []float64
		var halved int
		for _, p := range handedPlans(f) {
			lr := p.GetLrScale()
			if len(runs) == 0 || runs[len(runs)-1] != lr {
				runs = append(runs, lr)
			}
			if lr == 0.5 {
				halved++
			}
		}
		if !slices.Equal(runs, []float64{1, 0.5, 1}) {
			t.Errorf("rank %d: plan lr scales ran %v, want 1, then 0.5, then 1", f.id, runs)
		}
		if want == nil {
			want = []float64{float64(halved)}
		} else if want[0] != float64(halved) {
			t.Errorf("rank %d had %d plans at half rate, rank 0 had %v: the ranks changed rate apart", f.id, halved, want[0])
		}
	}
}

// Under async, a rank that runs more than max_batch_diff batches ahead of
// the slowest busy rank since the last round is throttled until the round;
// the slow rank never is, and every sample is trained once.
func TestThrottleAheadUnderAsync(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.Policy = config.PolicyAsync
	cfg.Coordinator.SyncEvery = 8
	cfg.Coordinator.ChunkBatches = 2
	cfg.Coordinator.MaxBatchDiff = 4
	const samples = 480
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(id uint32) rankScript {
		ms := time.Millisecond
		if id == 0 {
			ms = 15 * time.Millisecond
		}
		return rankScript{msPerBatch: ms, samples: samples}
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, samples)
	if n := len(messagesOf[*wirepb.Throttle](ranks[0])); n != 0 {
		t.Errorf("the slowest rank was throttled %d times", n)
	}
	var fast int
	for _, f := range ranks[1:] {
		fast += len(messagesOf[*wirepb.Throttle](f))
	}
	if fast == 0 || sum.Controller.Throttles != uint64(fast) {
		t.Errorf("fast ranks got %d Throttles, the summary counts %d; want some, and the same", fast, sum.Controller.Throttles)
	}
}

// A run stopped while the guard holds the rate down resumes in the guard:
// the checkpoint keeps the controller, the resumed run's first plans carry
// the halved rate the original's window after the save point had, and the
// resumed controller goes on to release the guard when divergence settles.
func TestResumeKeepsTheController(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.AdaptiveSync = false
	const samples = 960
	const spike = 8
	h1 := newHarness(t, cfg, nil)
	ranks := h1.startAll(func(uint32) rankScript {
		return rankScript{msPerBatch: 5 * time.Millisecond, samples: samples,
			divergence: func(r uint64) float64 {
				if r < spike {
					return 0.02
				}
				// A spike, then drift that outgrows its running mean: the
				// guard does not settle in this run.
				return 0.5 * math.Pow(1.6, float64(r-spike))
			}}
	})
	waitFor(t, "plans at half rate", func() bool {
		for _, p := range handedPlans(ranks[0]) {
			if p.GetLrScale() == 0.5 {
				return true
			}
		}
		return false
	})
	h1.coord.Stop()
	sum1, err := h1.wait()
	if err != nil || sum1.Status != record.StatusStopped || sum1.Checkpoint == "" {
		t.Fatalf("first run: status %s, checkpoint %q, error %v", statusOf(sum1), sum1.Checkpoint, err)
	}
	meta, err := checkpoint.ReadMeta(sum1.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Controller == nil || !meta.Controller.Guard || meta.ControllerWindow == nil || meta.ControllerWindow.LRScale != 0.5 {
		t.Fatalf("checkpoint controller %+v, window %+v: want the guard holding, rate 0.5", meta.Controller, meta.ControllerWindow)
	}

	h2 := newHarness(t, cfg, func(o *Options) { o.Resume = h1.out; o.Out = h1.out })
	ranks2 := h2.startAll(func(uint32) rankScript {
		return rankScript{msPerBatch: time.Millisecond, samples: samples,
			divergence: func(uint64) float64 { return 0.4 }} // settled, against the saved mean
	})
	sum2 := h2.mustComplete()
	plans := handedPlans(ranks2[0])
	if len(plans) == 0 || plans[0].GetLrScale() != 0.5 {
		t.Fatalf("the resumed run's first plan %v: want lr scale 0.5", plans)
	}
	rules := decisionRules(sum2.Controller)
	if !slices.Equal(rules, []string{dispatch.RuleGuardRelease}) || sum2.Controller.LRScale != 1 {
		t.Errorf("resumed decisions %v, final lr scale %g: want the guard released, rate 1", rules, sum2.Controller.LRScale)
	}
}

// decisionRules lists the rules of c's decisions, in order.
func decisionRules(c *dispatch.ControllerSummary) []string {
	var rules []string
	for _, d := range c.Decisions {
		rules = append(rules, d.Rule)
	}
	return rules
}
