// Command training benchmarks cohort's end-to-end training on Fashion-MNIST
// against what a user would run instead, in the same run, as ratios.
//
// Part 1, cohort vs PyTorch DDP, a matrix of models: `cohort run` on N
// local ranks (trainer libtorch, averager cpu, the default coordinator
// policy unless -policy or -sync-every say otherwise) against
// peers/ddp_fashion_mnist.py (torch DistributedDataParallel over gloo) with
// the same ranks, model, batch size per rank, optimizer, seed and threads
// per rank. The models (-matrix picks them and their seeds): the MLP
// 784-256-10 with SGD (lr -lr, momentum 0.9), trainer-libtorch's built-in
// cnn with SGD, and a transformer encoder (transformer.py, scripted to
// TorchScript here for each seed, so both sides start from the same
// weights) with AdamW (lr 0.002, weight decay 0.01). Both train -target-epochs epochs (default 6),
// as time-to-accuracy benchmarks do, so a side that needs one more epoch
// than -epochs to reach the target is charged that epoch instead of
// counting as never reaching it; the learning rate is constant, so the
// accuracy after -epochs epochs (default 3) is the final accuracy of a run
// of -epochs. For each it reads the time to the target test accuracy:
// cohort's from OUT/summary.json (the cumulative epoch seconds up to the
// first epoch at or above the target; an epoch's seconds run from its
// dispatch to the end of its evaluation on the callback rank), the peer's
// from its JSON lines (its elapsed_s also counts its evaluations). The
// MLP's target is -target (85%); the other models' is DDP's own mean
// accuracy one epoch before -epochs, rounded down to half a point. Goals:
// time ratio cohort/DDP at most 1.0 (the MLP's at most 0.5), accuracy
// difference after -epochs at least -0.1 points, judged on the means over
// each model's seeds 1..N. Each row ends in one JSON line,
// {"bench": "matrix", ...}, with the bytes each rank sent per epoch: the
// averager's own count for cohort, a ring all-reduce's for DDP.
//
// Part 3, one slow rank: cohort's sync, cadence and async policies on N
// ranks, the last held to about 1/-slow-factor of the others' speed by a
// per-batch delay in its trainer (sleep_per_batch_by_rank, sized from the
// batch time the async runs of equal ranks measure), each for
// -target-epochs over -hetero-seeds seeds; goal: cadence reaches the target
// in at most 0.6× sync's time. The DDP peer has no way to slow one rank, so
// against DDP the slow rank is held to -slow-cpu of one CPU by a cgroup on
// both sides (cohort's rank worker and its plugins; the peer's rank
// process, the rank-th it spawns), cohort running cadence; goal: at most
// 0.4× DDP's time (root only; skipped, and said so, elsewhere). The
// equal-rank async runs give the share of the epoch the ranks' training
// was held by rounds (goal: under 2%).
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
// Where is: main.go the flags, main and run; ddp.go part 1 (the DDP
// matrix), transformer.py its transformer; single.go part 2 (the lone-rank pairs); report.go the JSON
// report's types and the text helpers; runs.go the runs of cohort, the
// peer and the reference; pin.go pinning runs to CPUs.
//
//	go run ./bench/training                          # 4 ranks, 3 epochs, seeds 5/5/3, threads 1 and all cores for part 2
//	go run ./bench/training -cohort bin/cohort -matrix transformer=1 -skip-hetero -skip-single
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

	"github.com/cohortdl/cohort/bench/internal/matrix"
	"github.com/cohortdl/cohort/bench/internal/repo"
)

// Goals of the comparison.
const (
	goalTimeRatio   = 1.0  // cohort's time to target / DDP's, at most
	goalMLPRatio    = 0.5  // the same on the MLP
	goalAccDiff     = -0.1 // cohort's final accuracy - DDP's, in points, at least
	goalSingleRatio = 1.05 // cohort 1-rank epoch / plain libtorch epoch, at most
)

// dataDir is the data both sides train on; the peer reads it from here.
const dataDir = "/usr/share/datasets/fashion-mnist"

// options are the command line.
type options struct {
	cohort        string
	ranks         int
	epochs        int
	singleEpochs  int
	targetEpochs  int
	repeats       int
	target        float64
	matrix        []matrixModel
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
	skipHetero    bool
	slowFactor    float64
	slowCPU       float64
	heteroSeeds   int
	concurrent    bool
	keep          bool
	verbose       bool
}

func main() {
	var o options
	flag.StringVar(&o.cohort, "cohort", "bin/cohort", "the cohort binary (its plugins are looked up in plugins/ next to it)")
	flag.IntVar(&o.ranks, "ranks", 4, "ranks of the cohort vs DDP comparison")
	flag.IntVar(&o.epochs, "epochs", 3, "epochs after which the DDP comparison reads final accuracy, and of the slow-rank comparison's runs")
	flag.IntVar(&o.singleEpochs, "single-epochs", 5, "epochs of each run in the 1-rank comparison, a pair's ratio being of the runs' median epochs; with 3, the cold first epoch was one in three and the median of 15 pairs moved ±0.05 from run to run")
	flag.IntVar(&o.repeats, "repeats", 15, "pairs of runs (one of each side) in the 1-rank comparison; single pairs on a small machine range ±25%, and the median of 9 still moved ±0.05 from run to run")
	flag.IntVar(&o.targetEpochs, "target-epochs", 6, "epochs of the DDP comparison's runs, in which each side's time to the target is read")
	flag.Float64Var(&o.target, "target", 0.85, "target test accuracy")
	matrixList := flag.String("matrix", "mlp=5,cnn=5,transformer=3", "models of the cohort vs DDP comparison, each with its seeds 1..N (mlp, cnn, transformer)")
	flag.Float64Var(&o.lr, "lr", 0.05, "SGD learning rate (momentum 0.9) of the MLP and the cnn")
	flag.IntVar(&o.batch, "batch", 64, "batch size per rank")
	flag.IntVar(&o.threads, "threads", 1, "threads per rank in the cohort vs DDP comparison (the peer uses 1)")
	flag.StringVar(&o.policy, "policy", "", "cohort's coordinator policy (default: the built-in one)")
	flag.IntVar(&o.syncEvery, "sync-every", 0, "cohort's batches between averaging rounds (default: the built-in one)")
	threadsList := flag.String("single-threads", defaultSingleThreads(), "comma-separated threads of the 1-rank vs libtorch comparison")
	flag.StringVar(&o.python, "python", "/usr/bin/python3", "python with torch")
	flag.StringVar(&o.peer, "peer", "", "DDP peer script (default: ../shared/peers/ddp_fashion_mnist.py beside the repository, or beside the checkout a worktree or clone comes from)")
	flag.StringVar(&o.ref, "ref", "", "where to build the libtorch reference loop (default: bench/cohort-torch-ref-epoch next to the cohort binary)")
	flag.BoolVar(&o.skipDDP, "skip-ddp", false, "skip the cohort vs DDP comparison")
	flag.BoolVar(&o.skipSingle, "skip-single", false, "skip the 1-rank vs libtorch comparison")
	flag.BoolVar(&o.skipHetero, "skip-hetero", false, "skip the slow-rank comparison of cohort's policies and the async round share")
	flag.Float64Var(&o.slowFactor, "slow-factor", 3, "the slow rank's batch time, as a multiple of the others' (measured)")
	flag.IntVar(&o.heteroSeeds, "hetero-seeds", 3, "seeds 1..N of the slow-rank comparison")
	flag.Float64Var(&o.slowCPU, "slow-cpu", 0.15, "against DDP, the CPU quota (of one CPU) the slow rank is held to on both sides (needs root and cgroups)")
	flag.BoolVar(&o.concurrent, "concurrent", true, "in the 1-rank comparison, run a pair's two sides at once on disjoint halves of the CPUs where each half holds threads+1 of them")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (configs, outputs)")
	flag.BoolVar(&o.verbose, "v", false, "pass every run's output through to stderr")
	flag.Parse()

	var err error
	if o.singleThreads, err = parseInts(*threadsList); err != nil {
		err = fmt.Errorf("-single-threads: %w", err)
	} else if o.matrix, err = parseMatrix(*matrixList); err != nil {
		err = fmt.Errorf("-matrix: %w", err)
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

// parseMatrix reads "mlp=5,cnn=5,transformer=3": the matrix's models to
// run, in its order, with their seeds.
func parseMatrix(s string) ([]matrixModel, error) {
	seeds := map[string]int{}
	for _, f := range strings.Split(s, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(f), "=")
		v, err := strconv.Atoi(n)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("%q: want model=seeds, seeds at least 1", f)
		}
		if _, dup := seeds[name]; dup {
			return nil, fmt.Errorf("%q named twice", name)
		}
		seeds[name] = v
	}
	var out []matrixModel
	for _, m := range matrixModels {
		if n, ok := seeds[m.Name]; ok {
			m.Seeds = n
			out = append(out, m)
			delete(seeds, m.Name)
		}
	}
	for name := range seeds {
		return nil, fmt.Errorf("unknown model %q (mlp, cnn, transformer)", name)
	}
	return out, nil
}

func (o *options) check() error {
	switch {
	case o.ranks < 1, o.epochs < 1, o.singleEpochs < 1, o.batch < 1, o.threads < 1, o.repeats < 1, o.heteroSeeds < 1:
		return errors.New("-ranks, -epochs, -single-epochs, -hetero-seeds, -batch, -threads and -repeats must be at least 1")
	case !(o.slowFactor >= 1):
		return errors.New("-slow-factor must be at least 1")
	case !(o.slowCPU >= 0.1):
		return errors.New("-slow-cpu must be at least 0.1 (the kernel's least quota is 1 ms of a 10 ms period)")
	case !o.skipHetero && o.ranks < 2:
		return errors.New("the slow-rank comparison needs -ranks of at least 2 (or -skip-hetero)")
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

func run(o options) error {
	start := time.Now()
	root, err := repo.Root()
	if err != nil {
		return err
	}
	if o.cohort, err = repo.Cohort(o.cohort); err != nil {
		return err
	}
	if o.peer == "" && !o.skipDDP {
		if o.peer, err = repo.DDPPeer(root); err != nil {
			return err
		}
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
		Ranks: o.ranks, Epochs: o.epochs, SingleEpochs: o.singleEpochs, TargetEpochs: o.targetEpochs, Target: o.target, LR: o.lr, Momentum: momentum,
		Batch: o.batch, Threads: o.threads, Averager: averager,
		Policy: policyName(o.policy), SyncEvery: syncEveryValue(o.syncEvery), BuiltInPolicy: o.policy == "" && o.syncEvery == 0,
		Data: dataDir,
	}}
	var lines []matrix.Line
	if !o.skipDDP {
		for i, m := range o.matrix {
			if i > 0 {
				fmt.Println()
			}
			r, err := h.ddp(m)
			if err != nil {
				return err
			}
			rep.Matrix = append(rep.Matrix, r)
			lines = append(lines, r.line())
			if err := printJSON(r.line()); err != nil {
				return err
			}
		}
	}
	if !o.skipHetero {
		if !o.skipDDP {
			fmt.Println()
		}
		if rep.Hetero, err = h.hetero(); err != nil {
			return err
		}
	}
	if !o.skipSingle {
		if !o.skipDDP || !o.skipHetero {
			fmt.Println()
		}
		if rep.Single, err = h.single(); err != nil {
			return err
		}
	}
	rep.WallS = round3(time.Since(start).Seconds())
	fmt.Printf("\ntotal %.0f s\n", rep.WallS)
	// The matrix's lines again, together, before the whole report.
	for _, l := range lines {
		if err := printJSON(l); err != nil {
			return err
		}
	}
	return printJSON(rep)
}

func printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// harness holds what every run shares.
type harness struct {
	o    options
	root string
	tmp  string
	n    int // runs so far, for directory names
}
