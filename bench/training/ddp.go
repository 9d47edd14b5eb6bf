// Part 1: cohort vs PyTorch DDP, one row per model of the matrix.

package main

import (
	"errors"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cohortdl/cohort/bench/internal/matrix"
)

// matrixModel is one row of the matrix: a model, its optimizer and
// learning rate (the same on both sides), and how many seeds it runs.
type matrixModel struct {
	Name      string  // "mlp", "cnn" or "transformer"
	Optimizer string  // "sgd" or "adamw"
	LR        float64 // the learning rate of both sides
	Seeds     int
}

// The matrix's models, in the order they run. The transformer is
// bench/training/transformer.py's, scripted per seed at bench time.
var matrixModels = []matrixModel{
	{Name: "mlp", Optimizer: "sgd"},
	{Name: "cnn", Optimizer: "sgd"},
	{Name: "transformer", Optimizer: "adamw", LR: 0.002},
}

// Parameter counts of the built-in models on Fashion-MNIST (the
// transformer's comes from the script that writes it).
const (
	mlpParams = 784*256 + 256 + 256*10 + 10
	cnnParams = 206922
)

// ddpReport is one model's row.
type ddpReport struct {
	Model             string     `json:"model"`
	Optimizer         string     `json:"optimizer"`
	LR                float64    `json:"lr"`
	Params            int        `json:"params"`
	Target            float64    `json:"target"`
	TargetFrom        string     `json:"target_from"`
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
	// CohortBytes is what each rank's averager sent per epoch, by its own
	// count (half of the bytes it moved, rounds being symmetric); PeerBytes
	// is what a ring all-reduce of the float32 gradients sends per rank
	// per epoch, 2(N−1)/N of them per step.
	CohortBytes float64 `json:"cohort_bytes_per_rank_epoch"`
	PeerBytes   float64 `json:"ddp_bytes_per_rank_epoch"`
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

func (r *ddpReport) line() matrix.Line {
	return matrix.Line{Bench: "matrix", Model: r.Model, Optimizer: r.Optimizer, Where: "one-host", Params: r.Params,
		Seeds: len(r.Seeds), Target: r.Target, CohortAccuracy: r.Mean.CohortAccuracy, DDPAccuracy: r.Mean.PeerAccuracy,
		AccDiffPoints: r.Mean.AccDiffPoints, TimeRatio: r.Mean.Ratio, CohortToTarget: r.Mean.CohortToTargetS,
		DDPToTarget: r.Mean.PeerToTargetS, Bytes: r.Mean.CohortBytes, DDPBytes: r.Mean.PeerBytes}
}

// ratioGoal is the row's goal for the time ratio: every model at most
// DDP's time, the MLP, where cohort's claim was first made, at most half.
func ratioGoal(model string) float64 {
	if model == "mlp" {
		return goalMLPRatio
	}
	return goalTimeRatio
}

func (h *harness) ddp(m matrixModel) (*ddpReport, error) {
	o := h.o
	if m.LR == 0 {
		m.LR = o.lr
	}
	rep := &ddpReport{Model: m.Name, Optimizer: m.Optimizer, LR: m.LR, Peer: "torch-ddp-gloo", EpochIncludesEval: true,
		RatioGoal: ratioGoal(m.Name), AccuracyGoal: goalAccDiff}
	threads := "1 thread per rank"
	if o.threads != 1 {
		threads = fmt.Sprintf("%d threads per rank in cohort, 1 in the peer", o.threads)
	}
	opt := fmt.Sprintf("SGD lr %g momentum %g", m.LR, momentum)
	if m.Optimizer == "adamw" {
		opt = fmt.Sprintf("AdamW lr %g weight decay 0.01", m.LR)
	}
	fmt.Printf("cohort vs torch DDP (gloo), Fashion-MNIST, %s: %d ranks, %d epochs, batch %d per rank, %s, %s, %d seed(s)\n",
		describeModel(m.Name), o.ranks, o.targetEpochs, o.batch, opt, threads, m.Seeds)
	fmt.Printf("cohort: averager %s with its own defaults (smoothing included), policy %s; time to target = when the accuracy curve, linear between the per-epoch evaluations (from chance at 0 s), reaches the target, on both sides.\n", averager, describePolicy(o.policy, o.syncEvery))
	fmt.Printf("Final accuracy is read after epoch %d of %d (constant lr: the final accuracy of a %d-epoch run).\n", o.epochs, o.targetEpochs, o.epochs)
	fmt.Println("Both sides' times include their per-epoch evaluation (cohort's summary epoch seconds end after the evaluation on rank 0; the peer's elapsed_s is read after its own).")
	for seed := 1; seed <= m.Seeds; seed++ {
		s, params, err := h.ddpSeed(m, seed)
		if err != nil {
			return nil, fmt.Errorf("%s, seed %d: %w", m.Name, seed, err)
		}
		rep.Params = params
		rep.Seeds = append(rep.Seeds, s)
	}
	rep.Target, rep.TargetFrom = o.target, "fixed (-target)"
	if m.Name != "mlp" {
		rep.Target = curveTarget(rep.Seeds, o.epochs)
		rep.TargetFrom = fmt.Sprintf("DDP's mean accuracy after epoch %d, rounded down to half a point", max(o.epochs-1, 1))
	}
	fmt.Printf("Target %.1f%%: %s.\n\n", 100*rep.Target, rep.TargetFrom)
	fmt.Printf("%-5s  %13s  %11s  %6s  %10s  %8s  %9s  %11s  %9s\n", "seed", "cohort→target", "DDP→target", "ratio", "cohort acc", "DDP acc", "diff pts", "cohort wall", "DDP wall")
	for i := range rep.Seeds {
		rep.Seeds[i].toTarget(rep.Target)
		fmt.Println(ddpLine(strconv.Itoa(rep.Seeds[i].Seed), rep.Seeds[i].ddpFigures))
	}
	rep.Mean, rep.PairedSeeds, rep.CohortReached, rep.PeerReached = meanFigures(rep.Seeds)
	if m.Seeds > 1 {
		fmt.Println(ddpLine("mean", rep.Mean))
	}
	fmt.Println()
	mean := rep.Mean
	of := ""
	if m.Seeds > 1 {
		of = fmt.Sprintf(" (means; cohort reached the target in %d of %d seeds, DDP in %d; the ratio is over the %d seeds both reached)",
			rep.CohortReached, m.Seeds, rep.PeerReached, rep.PairedSeeds)
	}
	rep.RatioPass = ratioPass(rep.CohortReached, rep.PeerReached, m.Seeds, mean.Ratio, rep.RatioGoal)
	why := ""
	if missed := m.Seeds - rep.CohortReached; missed > 0 {
		why = fmt.Sprintf(" because cohort missed the target in %d of %d seed(s)", missed, m.Seeds)
	}
	fmt.Printf("time to %.1f%%:   cohort %s, DDP %s, ratio %s (goal ≤ %.2f): %s%s%s\n", 100*rep.Target,
		secs(mean.CohortToTargetS), secs(mean.PeerToTargetS), ratioStr(mean.Ratio), rep.RatioGoal, verdict(rep.RatioPass), why, of)
	rep.AccuracyPass = mean.AccDiffPoints >= goalAccDiff
	fmt.Printf("final accuracy: cohort %.2f%%, DDP %.2f%%, difference %+.2f points (goal ≥ %.1f): %s\n",
		100*mean.CohortAccuracy, 100*mean.PeerAccuracy, mean.AccDiffPoints, goalAccDiff, verdict(rep.AccuracyPass))
	fmt.Printf("bytes sent per rank per epoch: cohort %.3g (its averager's count; on one host the arenas meet in shared memory and only the round's control frames cross a socket), DDP %.3g (a ring all-reduce of every step's gradients)\n",
		mean.CohortBytes, mean.PeerBytes)
	return rep, nil
}

func describeModel(name string) string {
	switch name {
	case "mlp":
		return "MLP 784-256-10"
	case "cnn":
		return "trainer-libtorch's cnn"
	default:
		return "a transformer encoder over 7×7 patches (bench/training/transformer.py, TorchScript)"
	}
}

// curveTarget is DDP's mean accuracy after epoch epochs−1 (the first when
// there is one epoch), rounded down to half a point: a target DDP reaches
// before its final epoch, near its final accuracy.
func curveTarget(seeds []ddpSeed, epochs int) float64 {
	e := max(epochs-1, 1) - 1
	sum := 0.0
	for _, s := range seeds {
		sum += s.PeerEpochAcc[e]
	}
	return math.Floor(sum/float64(len(seeds))*200) / 200
}

// toTarget fills the seed's times to target and their ratio.
func (s *ddpSeed) toTarget(target float64) {
	s.CohortToTargetS, s.PeerToTargetS, s.Ratio = nil, nil, nil
	var elapsed []float64
	t := 0.0
	for _, e := range s.CohortEpochS {
		t += e
		elapsed = append(elapsed, t)
	}
	if t, ok := crossingTime(elapsed, s.CohortEpochAcc, target); ok {
		s.CohortToTargetS = ptr(round3(t))
	}
	if t, ok := crossingTime(s.PeerEpochS, s.PeerEpochAcc, target); ok {
		s.PeerToTargetS = ptr(round3(t))
	}
	if s.CohortToTargetS != nil && s.PeerToTargetS != nil && *s.PeerToTargetS > 0 {
		s.Ratio = ptr(round4(*s.CohortToTargetS / *s.PeerToTargetS))
	}
}

// ratioPass: cohort must reach the target in every seed; then the paired
// ratio must meet the goal, unless the peer reached it in none.
func ratioPass(cohortReached, peerReached, seeds int, ratio *float64, goal float64) bool {
	if cohortReached < seeds {
		return false
	}
	if peerReached == 0 {
		return true
	}
	return ratio != nil && *ratio <= goal
}

func ddpLine(label string, f ddpFigures) string {
	return fmt.Sprintf("%-5s  %13s  %11s  %6s  %9.2f%%  %7.2f%%  %+9.2f  %9.1f s  %7.1f s", label,
		secs(f.CohortToTargetS), secs(f.PeerToTargetS), ratioStr(f.Ratio),
		100*f.CohortAccuracy, 100*f.PeerAccuracy, f.AccDiffPoints, f.CohortProcessS, f.PeerProcessS)
}

// modelFile is what both sides train for the model and seed: the built-in
// name, or the transformer scripted with the seed's initial weights.
func (h *harness) modelFile(m matrixModel, seed int) (string, int, error) {
	switch m.Name {
	case "mlp":
		return "mlp", mlpParams, nil
	case "cnn":
		return "cnn", cnnParams, nil
	}
	path := filepath.Join(h.tmp, fmt.Sprintf("%s-%d.pt", m.Name, seed))
	cmd := exec.Command(h.o.python, filepath.Join(h.root, "bench", "training", "transformer.py"), "--seed", strconv.Itoa(seed), "--out", path)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, tail(string(ee.Stderr), 2000))
		}
		return "", 0, fmt.Errorf("script the transformer: %w", err)
	}
	params, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || params < 1 {
		return "", 0, fmt.Errorf("script the transformer: parameter count %q", out)
	}
	return path, params, nil
}

func (h *harness) ddpSeed(m matrixModel, seed int) (ddpSeed, int, error) {
	o := h.o
	model, params, err := h.modelFile(m, seed)
	if err != nil {
		return ddpSeed{}, 0, err
	}
	cfg := runConfig{Seed: seed, Policy: o.policy, SyncEvery: o.syncEvery, PluginDir: pluginDir(o.cohort),
		Data: dataDir, Model: model, Optimizer: m.Optimizer, Batch: o.batch, LR: m.LR, Threads: o.threads}
	sum, wall, err := h.cohortRun(cfg, o.ranks, o.targetEpochs, nil)
	if err != nil {
		return ddpSeed{}, 0, err
	}
	s := ddpSeed{Seed: seed}
	ep, err := epochFigures(sum.Epochs)
	if err != nil {
		return ddpSeed{}, 0, fmt.Errorf("cohort: %w", err)
	}
	s.CohortEpochS, s.CohortEpochAcc = ep.seconds, ep.accuracy
	s.CohortAccuracy = ep.accuracy[o.epochs-1]
	s.CohortTrainS = round3(ep.total)
	s.CohortProcessS = round3(wall)
	var rounds uint64
	for i, e := range sum.Epochs {
		s.CohortRounds += e.Rounds
		if i < o.epochs {
			rounds += e.Rounds
		}
	}
	// bytes_per_round sums the ranks' bytes moved, each rank's half sent.
	s.CohortBytes = math.Round(sum.Averaging.BytesPerRound / float64(2*o.ranks) * float64(rounds) / float64(o.epochs))

	p, err := h.peerRun(cfg, nil)
	if err != nil {
		return ddpSeed{}, 0, err
	}
	s.PeerAccuracy = p.Epochs[o.epochs-1].Accuracy
	s.PeerTrainS = p.WallS
	s.PeerProcessS = p.ProcessWallS
	for _, e := range p.Epochs {
		s.PeerEpochS = append(s.PeerEpochS, e.ElapsedS)
		s.PeerEpochAcc = append(s.PeerEpochAcc, e.Accuracy)
	}
	s.PeerBytes = ringBytesPerEpoch(params, o.ranks, o.batch)
	s.AccDiffPoints = round3(100 * (s.CohortAccuracy - s.PeerAccuracy))
	return s, params, nil
}

// trainSamples is Fashion-MNIST's training split.
const trainSamples = 60000

// ringBytesPerEpoch is what a ring all-reduce of params float32 gradients
// sends per rank per epoch: 2(N−1)/N of them at each of the rank's steps.
func ringBytesPerEpoch(params, ranks, batch int) float64 {
	if ranks < 2 {
		return 0
	}
	steps := trainSamples / ranks / batch
	return math.Round(float64(steps) * 4 * float64(params) * 2 * float64(ranks-1) / float64(ranks))
}

// meanFigures averages the seeds: accuracies, walls and bytes over every
// seed, times to target over the seeds each side reached it in, and the
// ratio over the seeds both reached it in (paired).
func meanFigures(seeds []ddpSeed) (m ddpFigures, paired, cohortReached, peerReached int) {
	var cAcc, pAcc, cTrain, pTrain, cProc, pProc, cT, pT, cPair, pPair, cBytes, pBytes float64
	for _, s := range seeds {
		cAcc += s.CohortAccuracy
		pAcc += s.PeerAccuracy
		cTrain += s.CohortTrainS
		pTrain += s.PeerTrainS
		cProc += s.CohortProcessS
		pProc += s.PeerProcessS
		cBytes += s.CohortBytes
		pBytes += s.PeerBytes
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
	m.CohortBytes, m.PeerBytes = math.Round(cBytes/n), math.Round(pBytes/n)
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
