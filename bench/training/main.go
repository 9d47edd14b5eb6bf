// Command training benchmarks cohort's end-to-end training on Fashion-MNIST
// against what a user would run instead, in the same run, as ratios.
//
// Part 1, cohort vs PyTorch DDP: `cohort run` on N local ranks (trainer
// libtorch, averager cpu, the default coordinator policy unless -policy or
// -sync-every say otherwise) against peers/ddp_fashion_mnist.py (torch
// DistributedDataParallel over gloo) with the same ranks, model (MLP
// 784-256-10), batch size per rank, optimizer (SGD, lr, momentum 0.9),
// seed and threads per rank. Both train -target-epochs epochs (default 6),
// as time-to-accuracy benchmarks do, so a side that needs one more epoch
// than -epochs to reach the target is charged that epoch instead of
// counting as never reaching it; the learning rate is constant, so the
// accuracy after -epochs epochs (default 3) is the final accuracy of a run
// of -epochs. For each it reads the time to the target test accuracy:
// cohort's from OUT/summary.json (the cumulative epoch seconds up to the
// first epoch at or above the target; an epoch's seconds run from its
// dispatch to the end of its evaluation on the callback rank), the peer's
// from its JSON lines (its elapsed_s also counts its evaluations). Goals:
// time ratio cohort/DDP at most 0.7, accuracy difference after -epochs at
// least -0.5 points. With -seeds N both run for seeds 1..N and the goals
// are judged on the means.
//
// Part 2, the plugin boundary: `cohort run --ranks 1` against
// cohort-torch-ref-epoch (plugins/trainer-libtorch/bench/ref_epoch.cpp, a
// plain libtorch loop of the same model in one process), at the same
// threads on both sides, comparing the median training time per epoch.
// cohort trains there on a data directory holding only the training files,
// so no evaluation runs and its epoch seconds are training time. A cohort
// of one rank runs no averaging rounds when its averager says a lone round
// changes nothing (averaging-cpu without an outer optimizer), and its plans
// hold about 200 ms of training each, the next always queued, with their
// batch reports merged ten a second: what is left is the plugin boundary
// itself (a Train call per plan, the reports' trip through the worker to the
// coordinator) and cohort's processes sharing the cores. The ratio is the
// median over pairs of runs, one of each side: at once on disjoint halves of
// the CPUs where the machine has room (-concurrent), else back to back.
// Goal: ratio at most 1.05.
//
// It prints aligned lines, then one JSON line with every figure. It exits
// non-zero only when something failed to run, never for a missed goal.
//
//	go run ./bench/training                          # 4 ranks, 3 epochs, 3 seeds, threads 1 and all cores for part 2
//	go run ./bench/training -cohort bin/cohort -seeds 1 -single-threads 1
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/bench/internal/repo"

	"github.com/cohortdl/cohort/core/config"
)

// Goals of the comparison.
const (
	goalTimeRatio   = 0.7  // cohort's time to target / DDP's, at most
	goalAccDiff     = -0.5 // cohort's final accuracy - DDP's, in points, at least
	goalSingleRatio = 1.05 // cohort 1-rank epoch / plain libtorch epoch, at most
)

// dataDir is the data both sides train on; the peer reads it from here.
const dataDir = "/usr/share/datasets/fashion-mnist"

// options are the command line.
type options struct {
	cohort        string
	ranks         int
	epochs        int
	targetEpochs  int
	repeats       int
	target        float64
	seeds         int
	lr            float64
	batch         int
	threads       int
	policy        string
	syncEvery     int
	singleThreads []int
	python        string
	peer          string
	ref           string
	skipDDP       bool
	skipSingle    bool
	concurrent    bool
	keep          bool
	verbose       bool
}

func main() {
	var o options
	flag.StringVar(&o.cohort, "cohort", "bin/cohort", "the cohort binary (its plugins are looked up in plugins/ next to it)")
	flag.IntVar(&o.ranks, "ranks", 4, "ranks of the cohort vs DDP comparison")
	flag.IntVar(&o.epochs, "epochs", 3, "epochs of the 1-rank runs; final accuracy of the DDP comparison is read after this many")
	flag.IntVar(&o.repeats, "repeats", 9, "pairs of runs (one of each side) in the 1-rank comparison; single pairs on a small machine range ±20%, so the median needs several")
	flag.IntVar(&o.targetEpochs, "target-epochs", 6, "epochs of the DDP comparison's runs, in which each side's time to the target is read")
	flag.Float64Var(&o.target, "target", 0.85, "target test accuracy")
	flag.IntVar(&o.seeds, "seeds", 3, "seeds 1..N of the cohort vs DDP comparison")
	flag.Float64Var(&o.lr, "lr", 0.05, "SGD learning rate (momentum 0.9)")
	flag.IntVar(&o.batch, "batch", 64, "batch size per rank")
	flag.IntVar(&o.threads, "threads", 1, "threads per rank in the cohort vs DDP comparison (the peer uses 1)")
	flag.StringVar(&o.policy, "policy", "", "cohort's coordinator policy (default: the built-in one)")
	flag.IntVar(&o.syncEvery, "sync-every", 0, "cohort's batches between averaging rounds (default: the built-in one)")
	threadsList := flag.String("single-threads", defaultSingleThreads(), "comma-separated threads of the 1-rank vs libtorch comparison")
	flag.StringVar(&o.python, "python", "/usr/bin/python3", "python with torch")
	flag.StringVar(&o.peer, "peer", "", "DDP peer script (default: ../shared/peers/ddp_fashion_mnist.py from the repository root)")
	flag.StringVar(&o.ref, "ref", "", "where to build the libtorch reference loop (default: bench/cohort-torch-ref-epoch next to the cohort binary)")
	flag.BoolVar(&o.skipDDP, "skip-ddp", false, "skip the cohort vs DDP comparison")
	flag.BoolVar(&o.skipSingle, "skip-single", false, "skip the 1-rank vs libtorch comparison")
	flag.BoolVar(&o.concurrent, "concurrent", true, "in the 1-rank comparison, run a pair's two sides at once on disjoint halves of the CPUs where each half holds threads+1 of them")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (configs, outputs)")
	flag.BoolVar(&o.verbose, "v", false, "pass every run's output through to stderr")
	flag.Parse()

	var err error
	if o.singleThreads, err = parseInts(*threadsList); err != nil {
		err = fmt.Errorf("-single-threads: %w", err)
	} else {
		err = o.check()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/training:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/training:", err)
		os.Exit(1)
	}
}

// defaultSingleThreads is "1" and, on a machine with more, its core count.
func defaultSingleThreads() string {
	if n := runtime.NumCPU(); n > 1 {
		return "1," + strconv.Itoa(n)
	}
	return "1"
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func (o *options) check() error {
	switch {
	case o.ranks < 1, o.epochs < 1, o.seeds < 1, o.batch < 1, o.threads < 1, o.repeats < 1:
		return errors.New("-ranks, -epochs, -seeds, -batch, -threads and -repeats must be at least 1")
	case o.targetEpochs < o.epochs:
		return errors.New("-target-epochs must be at least -epochs")
	case !(o.target > 0 && o.target <= 1):
		return errors.New("-target must be in (0, 1]")
	case !(o.lr > 0):
		return errors.New("-lr must be positive")
	case o.syncEvery < 0:
		return errors.New("-sync-every must not be negative")
	}
	return nil
}

// report is the final JSON line.
type report struct {
	Bench    string        `json:"bench"`
	Settings settingsJSON  `json:"settings"`
	DDP      *ddpReport    `json:"ddp,omitempty"`
	Single   *singleReport `json:"single,omitempty"`
	WallS    float64       `json:"wall_s"`
}

type settingsJSON struct {
	Ranks        int     `json:"ranks"`
	Epochs       int     `json:"epochs"`
	TargetEpochs int     `json:"target_epochs"`
	Target       float64 `json:"target"`
	Seeds        int     `json:"seeds"`
	LR           float64 `json:"lr"`
	Momentum     float64 `json:"momentum"`
	Batch        int     `json:"batch_per_rank"`
	Threads      int     `json:"threads_per_rank"`
	Model        string  `json:"model"`
	Averager     string  `json:"averager"`
	Policy       string  `json:"policy"`
	SyncEvery    int     `json:"sync_every"`
	// BuiltInPolicy: neither -policy nor -sync-every was given.
	BuiltInPolicy bool   `json:"built_in_policy"`
	Data          string `json:"data"`
}

func run(o options) error {
	start := time.Now()
	root, err := repo.Root()
	if err != nil {
		return err
	}
	if o.cohort, err = filepath.Abs(o.cohort); err != nil {
		return err
	}
	if _, err := os.Stat(o.cohort); err != nil {
		return fmt.Errorf("no cohort binary: %w (run make build, or name it with -cohort)", err)
	}
	if o.peer == "" {
		o.peer = filepath.Join(root, "..", "shared", "peers", "ddp_fashion_mnist.py")
	}
	if o.ref == "" {
		o.ref = filepath.Join(filepath.Dir(o.cohort), "bench", "cohort-torch-ref-epoch")
	}
	if o.ref, err = filepath.Abs(o.ref); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "cohort-bench-training-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	h := &harness{o: o, root: root, tmp: tmp}

	rep := report{Bench: "training", Settings: settingsJSON{
		Ranks: o.ranks, Epochs: o.epochs, TargetEpochs: o.targetEpochs, Target: o.target, Seeds: o.seeds, LR: o.lr, Momentum: momentum,
		Batch: o.batch, Threads: o.threads, Model: "mlp 784-256-10", Averager: averager,
		Policy: policyName(o.policy), SyncEvery: syncEveryValue(o.syncEvery), BuiltInPolicy: o.policy == "" && o.syncEvery == 0,
		Data: dataDir,
	}}
	if !o.skipDDP {
		if rep.DDP, err = h.ddp(); err != nil {
			return err
		}
	}
	if !o.skipSingle {
		if !o.skipDDP {
			fmt.Println()
		}
		if rep.Single, err = h.single(); err != nil {
			return err
		}
	}
	rep.WallS = round3(time.Since(start).Seconds())
	fmt.Printf("\ntotal %.0f s\n", rep.WallS)
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// policyName and syncEveryValue are the policy cohort runs with.
func policyName(p string) string {
	if p == "" {
		return defaultPolicy
	}
	return p
}

func syncEveryValue(n int) int {
	if n == 0 {
		return defaultSyncEvery
	}
	return n
}

// harness holds what every run shares.
type harness struct {
	o    options
	root string
	tmp  string
	n    int // runs so far, for directory names
}

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
	fmt.Printf("cohort: averager %s, policy %s; time to target = epoch seconds summed up to the first epoch at the target.\n", averager, describePolicy(o.policy, o.syncEvery))
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

	p, err := h.peerRun(seed)
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
		filepath.Base(h.o.ref), o.batch, o.lr, momentum, o.epochs, averager, describePolicy(o.policy, o.syncEvery))
	fmt.Printf("%d pairs of runs, one of each side. A pair's ratio is its cohort run's median training seconds per epoch over its\n", o.repeats)
	fmt.Println("reference run's; the verdict is the median of the pairs' ratios (timings on a small shared machine jump between fast and")
	fmt.Println("slow modes lasting seconds). Pairs \"at once\": both sides run together, each confined to one half of the CPUs (swapped")
	fmt.Println("every pair), where each half holds threads+1 CPUs; \"in turn\": back to back, alternating which side goes first. cohort trains on the training files only")
	fmt.Println("(no t10k files: no evaluation), so its epoch seconds are training plus whatever rounds it runs; the reference warms up")
	fmt.Printf("50 batches first and runs with OMP_WAIT_POLICY=%s, as the plugin does. \"training\" is the share of cohort's epoch its\n", ompWaitPolicy())
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
			sum, _, err := h.cohortRun(cfg, 1, o.epochs, cpus)
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

func verdict(pass bool) string {
	if pass {
		return "PASS"
	}
	return "MISS"
}

func secs(v *float64) string {
	if v == nil {
		return "not reached"
	}
	return fmt.Sprintf("%.2f s", *v)
}

func ratioStr(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *v)
}

// describePolicy says when cohort averages: "sync every 10 batches (the
// built-in default)".
func describePolicy(policy string, syncEvery int) string {
	p, n := policyName(policy), syncEveryValue(syncEvery)
	d := fmt.Sprintf("%s, sync_every %d", p, n)
	if p == string(config.PolicySync) {
		d = fmt.Sprintf("sync every %d batches", n)
	}
	if policy == "" && syncEvery == 0 {
		d += " (the built-in default)"
	}
	return d
}
