// Part 1: cohort vs PyTorch DDP.

package main

import (
	"fmt"
	"strconv"
)

// ddpReport is part 1.
type ddpReport struct {
	Peer              string     `json:"peer"`
	EpochIncludesEval bool       `json:"cohort_epoch_seconds_include_eval"`
	Seeds             []ddpSeed  `json:"seeds"`
	Mean              ddpFigures `json:"mean"`
	PairedSeeds       int        `json:"paired_seeds"`
	CohortReached     int        `json:"cohort_reached"`
	PeerReached       int        `json:"peer_reached"`
	RatioGoal         float64    `json:"ratio_goal"`
	RatioPass         bool       `json:"ratio_pass"`
	AccuracyGoal      float64    `json:"accuracy_diff_goal"`
	AccuracyPass      bool       `json:"accuracy_pass"`
}

// ddpFigures are one seed's figures, or their means.
type ddpFigures struct {
	CohortToTargetS *float64 `json:"cohort_seconds_to_target"`
	PeerToTargetS   *float64 `json:"peer_seconds_to_target"`
	Ratio           *float64 `json:"ratio"`
	CohortAccuracy  float64  `json:"cohort_final_accuracy"`
	PeerAccuracy    float64  `json:"peer_final_accuracy"`
	AccDiffPoints   float64  `json:"accuracy_diff_points"`
	CohortTrainS    float64  `json:"cohort_epochs_total_s"`
	PeerTrainS      float64  `json:"peer_wall_s"`
	CohortProcessS  float64  `json:"cohort_process_wall_s"`
	PeerProcessS    float64  `json:"peer_process_wall_s"`
}

type ddpSeed struct {
	Seed int `json:"seed"`
	ddpFigures
	CohortEpochS   []float64 `json:"cohort_epoch_s"`
	CohortEpochAcc []float64 `json:"cohort_epoch_accuracy"`
	PeerEpochS     []float64 `json:"peer_epoch_elapsed_s"`
	PeerEpochAcc   []float64 `json:"peer_epoch_accuracy"`
	CohortRounds   uint64    `json:"cohort_rounds"`
}

func (h *harness) ddp() (*ddpReport, error) {
	o := h.o
	rep := &ddpReport{Peer: "torch-ddp-gloo", EpochIncludesEval: true, RatioGoal: goalTimeRatio, AccuracyGoal: goalAccDiff}
	threads := "1 thread per rank"
	if o.threads != 1 {
		threads = fmt.Sprintf("%d threads per rank in cohort, 1 in the peer", o.threads)
	}
	fmt.Printf("cohort vs torch DDP (gloo), Fashion-MNIST, MLP 784-256-10: %d ranks, %d epochs, batch %d per rank, SGD lr %g momentum %g, %s, target %.1f%%\n",
		o.ranks, o.targetEpochs, o.batch, o.lr, momentum, threads, 100*o.target)
	fmt.Printf("cohort: averager %s with its own defaults (smoothing included), policy %s; time to target = epoch seconds summed up to the first epoch at the target.\n", averager, describePolicy(o.policy, o.syncEvery))
	fmt.Printf("Final accuracy is read after epoch %d of %d (constant lr: the final accuracy of a %d-epoch run).\n", o.epochs, o.targetEpochs, o.epochs)
	fmt.Println("Both sides' times include their per-epoch evaluation (cohort's summary epoch seconds end after the evaluation on rank 0; the peer's elapsed_s is read after its own).")
	fmt.Println()
	fmt.Printf("%-5s  %13s  %11s  %6s  %10s  %8s  %9s  %11s  %9s\n", "seed", "cohort→target", "DDP→target", "ratio", "cohort acc", "DDP acc", "diff pts", "cohort wall", "DDP wall")
	for seed := 1; seed <= o.seeds; seed++ {
		s, err := h.ddpSeed(seed)
		if err != nil {
			return nil, fmt.Errorf("seed %d: %w", seed, err)
		}
		rep.Seeds = append(rep.Seeds, s)
		fmt.Println(ddpLine(strconv.Itoa(seed), s.ddpFigures))
	}
	rep.Mean, rep.PairedSeeds, rep.CohortReached, rep.PeerReached = meanFigures(rep.Seeds)
	if o.seeds > 1 {
		fmt.Println(ddpLine("mean", rep.Mean))
	}
	fmt.Println()
	m := rep.Mean
	of := ""
	if o.seeds > 1 {
		of = fmt.Sprintf(" (means; cohort reached the target in %d of %d seeds, DDP in %d; the ratio is over the %d seeds both reached)",
			rep.CohortReached, o.seeds, rep.PeerReached, rep.PairedSeeds)
	}
	rep.RatioPass = ratioPass(rep.CohortReached, rep.PeerReached, o.seeds, m.Ratio)
	why := ""
	if missed := o.seeds - rep.CohortReached; missed > 0 {
		why = fmt.Sprintf(" because cohort missed the target in %d of %d seed(s)", missed, o.seeds)
	}
	fmt.Printf("time to %.1f%%:   cohort %s, DDP %s, ratio %s (goal ≤ %.2f): %s%s%s\n", 100*o.target,
		secs(m.CohortToTargetS), secs(m.PeerToTargetS), ratioStr(m.Ratio), goalTimeRatio, verdict(rep.RatioPass), why, of)
	rep.AccuracyPass = m.AccDiffPoints >= goalAccDiff
	fmt.Printf("final accuracy: cohort %.2f%%, DDP %.2f%%, difference %+.2f points (goal ≥ %.1f): %s\n",
		100*m.CohortAccuracy, 100*m.PeerAccuracy, m.AccDiffPoints, goalAccDiff, verdict(rep.AccuracyPass))
	return rep, nil
}

// ratioPass: cohort must reach the target in every seed; then the paired
// ratio must meet the goal, unless the peer reached it in none.
func ratioPass(cohortReached, peerReached, seeds int, ratio *float64) bool {
	if cohortReached < seeds {
		return false
	}
	if peerReached == 0 {
		return true
	}
	return ratio != nil && *ratio <= goalTimeRatio
}

func ddpLine(label string, f ddpFigures) string {
	return fmt.Sprintf("%-5s  %13s  %11s  %6s  %9.2f%%  %7.2f%%  %+9.2f  %9.1f s  %7.1f s", label,
		secs(f.CohortToTargetS), secs(f.PeerToTargetS), ratioStr(f.Ratio),
		100*f.CohortAccuracy, 100*f.PeerAccuracy, f.AccDiffPoints, f.CohortProcessS, f.PeerProcessS)
}

func (h *harness) ddpSeed(seed int) (ddpSeed, error) {
	o := h.o
	cfg := runConfig{Seed: seed, Policy: o.policy, SyncEvery: o.syncEvery, PluginDir: pluginDir(o.cohort),
		Data: dataDir, Batch: o.batch, LR: o.lr, Threads: o.threads}
	sum, wall, err := h.cohortRun(cfg, o.ranks, o.targetEpochs, nil)
	if err != nil {
		return ddpSeed{}, err
	}
	s := ddpSeed{Seed: seed}
	ep, err := epochFigures(sum.Epochs)
	if err != nil {
		return ddpSeed{}, fmt.Errorf("cohort: %w", err)
	}
	s.CohortEpochS, s.CohortEpochAcc = ep.seconds, ep.accuracy
	s.CohortAccuracy = ep.accuracy[o.epochs-1]
	s.CohortTrainS = round3(ep.total)
	s.CohortProcessS = round3(wall)
	if t, ok := timeToTarget(ep.seconds, ep.accuracy, o.target); ok {
		s.CohortToTargetS = ptr(round3(t))
	}
	for _, e := range sum.Epochs {
		s.CohortRounds += e.Rounds
	}

	p, err := h.peerRun(seed, nil)
	if err != nil {
		return ddpSeed{}, err
	}
	s.PeerAccuracy = p.Epochs[o.epochs-1].Accuracy
	if p.SecondsToTarget != nil {
		s.PeerToTargetS = ptr(round3(*p.SecondsToTarget))
	}
	s.PeerTrainS = p.WallS
	s.PeerProcessS = p.ProcessWallS
	for _, e := range p.Epochs {
		s.PeerEpochS = append(s.PeerEpochS, e.ElapsedS)
		s.PeerEpochAcc = append(s.PeerEpochAcc, e.Accuracy)
	}
	if s.CohortToTargetS != nil && s.PeerToTargetS != nil && *s.PeerToTargetS > 0 {
		s.Ratio = ptr(round4(*s.CohortToTargetS / *s.PeerToTargetS))
	}
	s.AccDiffPoints = round3(100 * (s.CohortAccuracy - s.PeerAccuracy))
	return s, nil
}

// meanFigures averages the seeds: accuracies and walls over every seed,
// times to target over the seeds each side reached it in, and the ratio
// over the seeds both reached it in (paired).
func meanFigures(seeds []ddpSeed) (m ddpFigures, paired, cohortReached, peerReached int) {
	var cAcc, pAcc, cTrain, pTrain, cProc, pProc, cT, pT, cPair, pPair float64
	for _, s := range seeds {
		cAcc += s.CohortAccuracy
		pAcc += s.PeerAccuracy
		cTrain += s.CohortTrainS
		pTrain += s.PeerTrainS
		cProc += s.CohortProcessS
		pProc += s.PeerProcessS
		if s.CohortToTargetS != nil {
			cohortReached++
			cT += *s.CohortToTargetS
		}
		if s.PeerToTargetS != nil {
			peerReached++
			pT += *s.PeerToTargetS
		}
		if s.CohortToTargetS != nil && s.PeerToTargetS != nil {
			paired++
			cPair += *s.CohortToTargetS
			pPair += *s.PeerToTargetS
		}
	}
	n := float64(len(seeds))
	if n == 0 {
		return m, 0, 0, 0
	}
	m.CohortAccuracy, m.PeerAccuracy = round4(cAcc/n), round4(pAcc/n)
	m.AccDiffPoints = round3(100 * (cAcc - pAcc) / n)
	m.CohortTrainS, m.PeerTrainS = round3(cTrain/n), round3(pTrain/n)
	m.CohortProcessS, m.PeerProcessS = round3(cProc/n), round3(pProc/n)
	if cohortReached > 0 {
		m.CohortToTargetS = ptr(round3(cT / float64(cohortReached)))
	}
	if peerReached > 0 {
		m.PeerToTargetS = ptr(round3(pT / float64(peerReached)))
	}
	if paired > 0 && pPair > 0 {
		m.Ratio = ptr(round4(cPair / pPair))
	}
	return m, paired, cohortReached, peerReached
}
