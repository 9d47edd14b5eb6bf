// Part 2: cohort on one rank vs the plain libtorch loop, in pairs of runs.

package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// singleReport is part 2.
type singleReport struct {
	Averager string      `json:"averager"`
	Goal     float64     `json:"ratio_goal"`
	Rows     []singleRow `json:"threads"`
	Pass     bool        `json:"pass"`
}

type singleRow struct {
	Threads        int       `json:"threads"`
	CohortEpochS   []float64 `json:"cohort_epoch_s"`
	CohortMedianS  float64   `json:"cohort_median_epoch_s"`
	PlansPerEpoch  float64   `json:"cohort_plans_per_epoch"`
	RoundsPerEpoch float64   `json:"cohort_rounds_per_epoch"`
	MeanRoundMS    float64   `json:"cohort_mean_round_ms"`
	RefEpochS      []float64 `json:"libtorch_epoch_s"`
	RefMedianS     float64   `json:"libtorch_median_epoch_s"`
	PairRatios     []float64 `json:"pair_ratios"`
	// Pairs is "in turn" (back to back) or "at once" (side by side on the
	// halves of the machine in CPUs, cohort on the first in even pairs).
	Pairs string   `json:"pairs"`
	CPUs  []string `json:"cpus,omitempty"`
	// TrainShare is the median over cohort's epochs of the time its
	// trainer spent in batches, by its own clock, over the epoch's time:
	// the rest is what the boundary costs outside libtorch's steps,
	// measured within each epoch, so the machine's drift cancels.
	TrainShare float64 `json:"cohort_train_share"`
	Ratio      float64 `json:"ratio"`
	Pass       bool    `json:"pass"`
}

// single compares cohort on one rank with the reference loop. Timings on a
// small shared machine jump between fast and slow modes lasting seconds (at
// 2 threads the reference alone moves between 0.7 and 1.3 s per epoch, often
// for a whole run), so the ratio is taken per pair of runs, one of each
// side, and the verdict is the median of the pairs' ratios. Where each half
// of the machine's CPUs holds threads+1 of them, a pair's runs go at once,
// each side confined to one half (swapped every pair), so whatever the
// machine does meanwhile hits both; elsewhere they go back to back,
// alternating which side runs first, so a steady drift favours neither.
func (h *harness) single() (*singleReport, error) {
	o := h.o
	rep := &singleReport{Averager: averager, Goal: goalSingleRatio, Pass: true}
	fmt.Printf("cohort on 1 rank vs plain libtorch in one process (%s): MLP 784-256-10, batch %d, SGD lr %g momentum %g, %d epochs, seed 1, averager %s, policy %s\n",
		filepath.Base(h.o.ref), o.batch, o.lr, momentum, o.singleEpochs, averager, describePolicy(o.policy, o.syncEvery))
	fmt.Printf("%d pairs of runs, one of each side. A pair's ratio is its cohort run's median training seconds per epoch over its\n", o.repeats)
	fmt.Println("reference run's; the verdict is the median of the pairs' ratios (timings on a small shared machine jump between fast and")
	fmt.Println("slow modes lasting seconds). Pairs \"at once\": both sides run together, each confined to one half of the CPUs (swapped")
	fmt.Println("every pair), where each half holds threads+1 CPUs; \"in turn\": back to back, alternating which side goes first. cohort trains on the training files only")
	fmt.Println("(no t10k files: no evaluation), so its epoch seconds are training plus whatever rounds it runs. Both sides start cold:")
	fmt.Println("each side's first epoch holds its first batches (thread pools and the heap growing), as a run's does; the reference")
	malloc := "the environment's malloc settings"
	if m := refMalloc(); m != nil {
		malloc = strings.Join(m, " ")
	}
	fmt.Printf("runs with OMP_WAIT_POLICY=%s, OPENBLAS_THREAD_TIMEOUT=%s and %s, as the plugin does. \"training\" is the share of cohort's epoch its\n", ompWaitPolicy(), openBLASThreadTimeout(), malloc)
	fmt.Println("trainer spent in batches by its own clock (gather and libtorch step; the median over epochs): the rest is the boundary's")
	fmt.Println("time outside the steps, measured within each epoch, so the machine's drift cancels.")

	trainOnly, err := h.trainOnlyData()
	if err != nil {
		return nil, err
	}
	images, labels, n, features, err := h.rawTrainingSet()
	if err != nil {
		return nil, err
	}
	if err := h.buildRef(); err != nil {
		return nil, err
	}
	cpus, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	fmt.Println()
	fmt.Printf("%7s  %-7s  %14s  %8s  %11s  %12s  %9s  %16s  %-29s  %6s  %s\n", "threads", "pairs", "cohort s/epoch", "training", "plans/epoch", "rounds/epoch", "ms/round", "libtorch s/epoch", "pair ratios", "ratio", "goal")
	for _, th := range o.singleThreads {
		cfg := runConfig{Seed: 1, Policy: o.policy, SyncEvery: o.syncEvery, PluginDir: pluginDir(o.cohort),
			Data: trainOnly, Batch: o.batch, LR: o.lr, Threads: th}
		row := singleRow{Threads: th}
		var rounds, plans, epochs uint64
		var roundMS float64
		var shares []float64
		cohortSide := func(cpus []int) ([]float64, error) {
			sum, _, err := h.cohortRun(cfg, 1, o.singleEpochs, cpus)
			if err != nil {
				return nil, fmt.Errorf("1 rank, %d threads: %w", th, err)
			}
			var s []float64
			for _, e := range sum.Epochs {
				s = append(s, round4(e.Seconds))
				rounds += e.Rounds
				roundMS += e.MeanRoundMS * float64(e.Rounds)
				for _, r := range e.Ranks {
					plans += r.Windows
					if e.Seconds > 0 {
						shares = append(shares, r.TrainMS/(e.Seconds*1e3))
					}
				}
				epochs++
			}
			return s, nil
		}
		refSide := func(cpus []int) ([]float64, error) { return h.refRun(images, labels, n, features, th, cpus) }
		halfA, halfB, together := cpuHalves(cpus, th+1)
		together = together && o.concurrent
		row.Pairs = "in turn"
		if together {
			row.Pairs = "at once"
			row.CPUs = []string{cpuList(halfA), cpuList(halfB)}
		}
		for i := range o.repeats {
			var c, r []float64
			var err error
			switch {
			case together:
				// Both sides at once on disjoint halves of the machine, so
				// its drift hits both; the halves swap every pair.
				cc, rc := halfA, halfB
				if i%2 == 1 {
					cc, rc = halfB, halfA
				}
				var cerr error
				done := make(chan struct{})
				go func() {
					defer close(done)
					c, cerr = cohortSide(cc)
				}()
				r, err = refSide(rc)
				<-done
				err = errors.Join(cerr, err)
			case i%2 == 0:
				if c, err = cohortSide(nil); err == nil {
					r, err = refSide(nil)
				}
			default:
				if r, err = refSide(nil); err == nil {
					c, err = cohortSide(nil)
				}
			}
			if err != nil {
				return nil, err
			}
			row.CohortEpochS = append(row.CohortEpochS, c...)
			row.RefEpochS = append(row.RefEpochS, r...)
			row.PairRatios = append(row.PairRatios, round4(median(c)/median(r)))
		}
		row.CohortMedianS = median(row.CohortEpochS)
		row.PlansPerEpoch = round3(float64(plans) / float64(epochs))
		row.RoundsPerEpoch = round3(float64(rounds) / float64(epochs))
		if rounds > 0 {
			row.MeanRoundMS = round3(roundMS / float64(rounds))
		}
		row.RefMedianS = median(row.RefEpochS)
		row.TrainShare = round4(median(shares))
		row.Ratio = round4(median(row.PairRatios))
		row.Pass = row.Ratio <= goalSingleRatio
		rep.Pass = rep.Pass && row.Pass
		roundCol := "-"
		if rounds > 0 {
			roundCol = fmt.Sprintf("%.2f", row.MeanRoundMS)
		}
		pairs := make([]string, len(row.PairRatios))
		for i, v := range row.PairRatios {
			pairs[i] = fmt.Sprintf("%.2f", v)
		}
		fmt.Printf("%7d  %-7s  %14.3f  %7.1f%%  %11.1f  %12.1f  %9s  %16.3f  %-29s  %6.3f  %s\n", th, row.Pairs, row.CohortMedianS, 100*row.TrainShare, row.PlansPerEpoch, row.RoundsPerEpoch, roundCol,
			row.RefMedianS, strings.Join(pairs, " "), row.Ratio, verdict(row.Pass))
		rep.Rows = append(rep.Rows, row)
	}
	fmt.Println()
	fmt.Printf("goal: cohort 1-rank epoch / libtorch epoch ≤ %.2f at every thread count (median of the pairs): %s\n", goalSingleRatio, verdict(rep.Pass))
	return rep, nil
}
