// Part 3: one slow rank, cohort's policies against each other; and the
// async policy's time spent in rounds.

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Goals of part 3.
const (
	goalHeteroRatio = 0.6  // cadence's (and async's) time to target / sync's, at most
	goalQuotaRatio  = 0.4  // cadence's time to target / DDP's, one rank under a CPU quota on both, at most
	goalAsyncWait   = 0.02 // async: share of the epoch in rounds, under
)

// heteroReport is part 3.
type heteroReport struct {
	SlowRank    int            `json:"slow_rank"`
	BatchMS     float64        `json:"measured_batch_ms"`
	SlowDelayMS float64        `json:"slow_delay_ms"`
	SlowFactor  float64        `json:"slow_factor"`
	Policies    []heteroPolicy `json:"policies"`
	// CadenceRatio and AsyncRatio are each policy's mean time to target
	// over sync's, over the seeds all three reached it in.
	CadenceRatio *float64 `json:"cadence_ratio"`
	AsyncRatio   *float64 `json:"async_ratio"`
	RatioGoal    float64  `json:"ratio_goal"`
	CadencePass  bool     `json:"cadence_pass"`
	// Against DDP, whose peer script cannot slow a rank itself, the slow
	// rank is held to QuotaCPUs of one CPU by a cgroup on both sides (its
	// worker and plugins; DDP's rank process), cohort running cadence.
	DDPMeasured  bool       `json:"ddp_measured"`
	QuotaCPUs    float64    `json:"quota_cpus"`
	QuotaSkipped string     `json:"quota_skipped,omitempty"`
	QuotaCohort  []*float64 `json:"quota_cadence_seconds_to_target,omitempty"`
	QuotaDDP     []*float64 `json:"quota_ddp_seconds_to_target,omitempty"`
	QuotaRatio   *float64   `json:"quota_ratio"`
	QuotaGoal    float64    `json:"quota_ratio_goal"`
	QuotaPass    bool       `json:"quota_pass"`
	// AsyncWaitShare is, for the async runs without a slow rank, the
	// share of the epoch the ranks' training was held by rounds, by the
	// ranks' own clocks (summary.json's round_wait_ms per rank, over the
	// ranks' epoch seconds).
	AsyncWaitShare float64 `json:"async_round_share"`
	// AsyncBlockingShare is the same with async_overlap = false, every
	// round holding training for its whole length.
	AsyncBlockingShare float64 `json:"async_blocking_round_share"`
	AsyncWaitGoal      float64 `json:"async_round_share_goal"`
	AsyncWaitPass      bool    `json:"async_round_share_pass"`
}

// heteroPolicy is one policy's runs with the slow rank.
type heteroPolicy struct {
	Policy   string     `json:"policy"`
	ToTarget []*float64 `json:"seconds_to_target"`
	Accuracy []float64  `json:"final_accuracy"`
	Rounds   []uint64   `json:"rounds"`
	MeanToS  *float64   `json:"mean_seconds_to_target"`
	MeanAcc  float64    `json:"mean_final_accuracy"`
}

var heteroPolicies = []string{"sync", "cadence", "async"}

func (h *harness) hetero() (*heteroReport, error) {
	o := h.o
	rep := &heteroReport{SlowRank: o.ranks - 1, SlowFactor: o.slowFactor, RatioGoal: goalHeteroRatio, AsyncWaitGoal: goalAsyncWait,
		QuotaCPUs: o.slowCPU, QuotaGoal: goalQuotaRatio}
	base := runConfig{Seed: 1, PluginDir: pluginDir(o.cohort), Data: dataDir, Batch: o.batch, LR: o.lr, Threads: o.threads}

	// The async runs of equal ranks, rounds beside training and blocking;
	// the first also time a batch.
	var batchMS []float64
	for _, blocking := range []bool{false, true} {
		var waitMS, epochMS float64
		for seed := 1; seed <= o.heteroSeeds; seed++ {
			cfg := base
			cfg.Seed, cfg.Policy, cfg.Blocking = seed, "async", blocking
			sum, _, err := h.cohortRun(cfg, o.ranks, o.epochs, nil)
			if err != nil {
				return nil, fmt.Errorf("async (blocking rounds %v), equal ranks, seed %d: %w", blocking, seed, err)
			}
			for _, e := range sum.Epochs {
				for _, r := range e.Ranks {
					waitMS += r.RoundWaitMS
					epochMS += 1000 * e.Seconds
					if r.Batches > 0 && !blocking {
						batchMS = append(batchMS, r.TrainMS/float64(r.Batches))
					}
				}
			}
		}
		share := 0.0
		if epochMS > 0 {
			share = round4(waitMS / epochMS)
		}
		if blocking {
			rep.AsyncBlockingShare = share
		} else {
			rep.AsyncWaitShare = share
		}
	}
	rep.AsyncWaitPass = rep.AsyncWaitShare < goalAsyncWait
	rep.BatchMS = round3(mean(batchMS))
	delay := time.Duration((o.slowFactor - 1) * rep.BatchMS * float64(time.Millisecond)).Round(100 * time.Microsecond)
	rep.SlowDelayMS = round3(plugin.Milliseconds(delay))

	fmt.Printf("one slow rank: %d ranks, rank %d sleeps %.1f ms per batch (%.1f ms measured: about 1/%g of the others' speed), %d epochs, target %.1f%%, seeds 1..%d\n",
		o.ranks, rep.SlowRank, rep.SlowDelayMS, rep.BatchMS, o.slowFactor, o.targetEpochs, 100*o.target, o.heteroSeeds)
	fmt.Printf("%-8s  %13s  %10s  %8s\n", "policy", "→target", "acc", "rounds")
	for _, policy := range heteroPolicies {
		hp := heteroPolicy{Policy: policy}
		for seed := 1; seed <= o.heteroSeeds; seed++ {
			cfg := base
			cfg.Seed, cfg.Policy, cfg.SlowRank, cfg.SlowDelay = seed, policy, rep.SlowRank, delay
			sum, _, err := h.cohortRun(cfg, o.ranks, o.targetEpochs, nil)
			if err != nil {
				return nil, fmt.Errorf("%s with a slow rank, seed %d: %w", policy, seed, err)
			}
			ep, err := epochFigures(sum.Epochs)
			if err != nil {
				return nil, fmt.Errorf("%s, seed %d: %w", policy, seed, err)
			}
			var to *float64
			if t, ok := timeToTarget(ep.seconds, ep.accuracy, o.target); ok {
				to = ptr(round3(t))
			}
			hp.ToTarget = append(hp.ToTarget, to)
			hp.Accuracy = append(hp.Accuracy, ep.accuracy[o.epochs-1])
			hp.Rounds = append(hp.Rounds, totalRounds(sum))
		}
		hp.MeanToS, hp.MeanAcc = meanReached(hp.ToTarget), round4(mean(hp.Accuracy))
		rep.Policies = append(rep.Policies, hp)
		fmt.Printf("%-8s  %13s  %9.2f%%  %8d\n", policy, secs(hp.MeanToS), 100*hp.MeanAcc, sumU(hp.Rounds)/uint64(o.heteroSeeds))
	}
	rep.CadenceRatio = pairedRatio(rep.Policies[1].ToTarget, rep.Policies[0].ToTarget)
	rep.AsyncRatio = pairedRatio(rep.Policies[2].ToTarget, rep.Policies[0].ToTarget)
	rep.CadencePass = rep.CadenceRatio != nil && *rep.CadenceRatio <= goalHeteroRatio
	fmt.Printf("time to %.1f%% against sync's: cadence %s (goal ≤ %.2f): %s; async %s\n", 100*o.target,
		ratioStr(rep.CadenceRatio), goalHeteroRatio, verdict(rep.CadencePass), ratioStr(rep.AsyncRatio))
	if err := h.quotaRows(rep, base); err != nil {
		return nil, err
	}
	fmt.Printf("async, equal ranks: rounds hold training %.1f%% of the epoch (goal < %.0f%%): %s; with blocking rounds %.1f%%\n",
		100*rep.AsyncWaitShare, 100*goalAsyncWait, verdict(rep.AsyncWaitPass), 100*rep.AsyncBlockingShare)
	return rep, nil
}

func totalRounds(s *record.Summary) uint64 {
	var n uint64
	for _, e := range s.Epochs {
		n += e.Rounds
	}
	return n
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func sumU(v []uint64) uint64 {
	var s uint64
	for _, x := range v {
		s += x
	}
	return s
}

// meanReached is the mean of the times that reached the target, or nil.
func meanReached(ts []*float64) *float64 {
	var s float64
	var n int
	for _, t := range ts {
		if t != nil {
			s += *t
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return ptr(round3(s / float64(n)))
}

// pairedRatio is Σa / Σb over the seeds both reached the target in.
func pairedRatio(a, b []*float64) *float64 {
	var sa, sb float64
	for i := range a {
		if i < len(b) && a[i] != nil && b[i] != nil {
			sa += *a[i]
			sb += *b[i]
		}
	}
	if sb == 0 {
		return nil
	}
	return ptr(round4(sa / sb))
}

// quotaRows compares cohort (cadence) with DDP, rank N-1 held to
// -slow-cpu of one CPU on both sides; without a writable cgroup hierarchy
// it says so and measures nothing.
func (h *harness) quotaRows(rep *heteroReport, base runConfig) error {
	o := h.o
	q, err := newCPUQuota(fmt.Sprintf("cohort-bench-%d", os.Getpid()), o.slowCPU)
	if err != nil {
		rep.QuotaSkipped = err.Error()
		fmt.Printf("against DDP, rank %d under a CPU quota: not measured (%v; it needs root)\n", rep.SlowRank, err)
		return nil
	}
	defer q.close()
	for seed := 1; seed <= o.heteroSeeds; seed++ {
		cfg := base
		cfg.Seed, cfg.Policy = seed, "cadence"
		cfg.Hook = quotaHook(q, cohortRankProcs(rep.SlowRank))
		sum, _, err := h.cohortRun(cfg, o.ranks, o.targetEpochs, nil)
		if err != nil {
			return fmt.Errorf("cadence, rank %d under a CPU quota, seed %d: %w", rep.SlowRank, seed, err)
		}
		ep, err := epochFigures(sum.Epochs)
		if err != nil {
			return fmt.Errorf("cadence under a quota, seed %d: %w", seed, err)
		}
		var to *float64
		if t, ok := timeToTarget(ep.seconds, ep.accuracy, o.target); ok {
			to = ptr(round3(t))
		}
		rep.QuotaCohort = append(rep.QuotaCohort, to)
		p, err := h.peerRun(runConfig{Seed: seed, Batch: o.batch, LR: o.lr}, quotaHook(q, ddpRankProcs(rep.SlowRank, o.ranks)))
		if err != nil {
			return fmt.Errorf("DDP, rank %d under a CPU quota, seed %d: %w", rep.SlowRank, seed, err)
		}
		var pt *float64
		if p.SecondsToTarget != nil {
			pt = ptr(round3(*p.SecondsToTarget))
		}
		rep.QuotaDDP = append(rep.QuotaDDP, pt)
	}
	rep.DDPMeasured = true
	rep.QuotaRatio = pairedRatio(rep.QuotaCohort, rep.QuotaDDP)
	rep.QuotaPass = rep.QuotaRatio != nil && *rep.QuotaRatio <= goalQuotaRatio
	fmt.Printf("against DDP, rank %d held to %g CPU on both sides: cadence %s, DDP %s to %.1f%%, ratio %s (goal ≤ %.2f): %s\n",
		rep.SlowRank, o.slowCPU, secs(meanReached(rep.QuotaCohort)), secs(meanReached(rep.QuotaDDP)), 100*o.target,
		ratioStr(rep.QuotaRatio), goalQuotaRatio, verdict(rep.QuotaPass))
	return nil
}
