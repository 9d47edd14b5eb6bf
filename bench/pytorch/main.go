// Command pytorch is `make bench`'s row for trainer-pytorch: one rank's
// epoch under cohort (cohort run, 1 rank, the trainer file of
// examples/pytorch, no evaluation) against the same file's model,
// optimizer, data and loss trained by a plain PyTorch loop in one process
// (ref_loop.py), threads alike. The machine's speed drifts for seconds at
// a time, so runs go in pairs, one of each side, alternating which goes
// first; a pair's ratio is its cohort median epoch over its loop's, and
// the verdict is the median of the pairs' ratios against the goal. It
// prints a table and one JSON line.
//
//	go run ./bench/pytorch -cohort bin/cohort
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/bench/internal/repo"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// goal is the most a lone rank's epoch may take, as a multiple of the
// plain loop's.
const goal = 1.10

type options struct {
	cohort, python, file string
	epochs, repeats      int
	threads              int
	verbose              bool
}

type result struct {
	Bench      string    `json:"bench"`
	File       string    `json:"trainer_file"`
	Threads    int       `json:"threads"`
	Epochs     int       `json:"epochs"`
	CohortS    []float64 `json:"cohort_epoch_s"`
	LoopS      []float64 `json:"loop_epoch_s"`
	PairRatios []float64 `json:"pair_ratios"`
	Ratio      float64   `json:"ratio"`
	Goal       float64   `json:"ratio_goal"`
	Pass       bool      `json:"pass"`
}

func main() {
	var o options
	flag.StringVar(&o.cohort, "cohort", "bin/cohort", "the cohort binary (its plugins are looked up in plugins/ next to it)")
	flag.StringVar(&o.python, "python", "/usr/bin/python3", "the Python the plain loop runs on (torch)")
	flag.StringVar(&o.file, "file", "examples/pytorch/train.py", "the trainer file, from the repository root")
	flag.IntVar(&o.epochs, "epochs", 3, "epochs of every run")
	flag.IntVar(&o.repeats, "repeats", 3, "pairs of runs, one of each side")
	flag.IntVar(&o.threads, "threads", 1, "intra-op threads of both sides")
	flag.BoolVar(&o.verbose, "v", false, "pass every run's output through to stderr")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/pytorch:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	root, err := repo.Root()
	if err != nil {
		return err
	}
	for _, p := range []*string{&o.cohort, &o.file} {
		if !filepath.IsAbs(*p) {
			*p = filepath.Join(root, *p)
		}
	}
	tmp, err := os.MkdirTemp("", "bench-pytorch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	res := result{Bench: "pytorch", File: o.file, Threads: o.threads, Epochs: o.epochs, Goal: goal}
	fmt.Printf("cohort on 1 rank with trainer-pytorch vs a plain PyTorch loop in one process: %s, %d epochs, %d threads, %d pairs\n",
		filepath.Base(o.file), o.epochs, o.threads, o.repeats)
	for i := range o.repeats {
		var c, l []float64
		var err error
		if i%2 == 0 {
			if c, err = cohortSide(o, root, filepath.Join(tmp, strconv.Itoa(i))); err == nil {
				l, err = loopSide(o, root)
			}
		} else if l, err = loopSide(o, root); err == nil {
			c, err = cohortSide(o, root, filepath.Join(tmp, strconv.Itoa(i)))
		}
		if err != nil {
			return err
		}
		res.CohortS = append(res.CohortS, c...)
		res.LoopS = append(res.LoopS, l...)
		r := round4(median(c) / median(l))
		res.PairRatios = append(res.PairRatios, r)
		fmt.Printf("pair %d: cohort %.3f s/epoch, loop %.3f s/epoch, ratio %.3f\n", i+1, median(c), median(l), r)
	}
	res.Ratio = median(res.PairRatios)
	res.Pass = res.Ratio <= goal
	verdict := "FAIL"
	if res.Pass {
		verdict = "pass"
	}
	fmt.Printf("goal: trainer-pytorch 1-rank epoch / plain PyTorch epoch ≤ %.2f (median of the pairs): %.3f %s\n", goal, res.Ratio, verdict)
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// cohortSide runs cohort on one rank and returns its epochs' seconds.
func cohortSide(o options, root, dir string) ([]float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`run {
  seed = 1
}
coordinator {
  eval_every = 0
}
worker {
  plugin_dir = %q
}
trainer "pytorch" {
  file    = %q
  threads = %d
}
averager "cpu" {
}
`, filepath.Join(filepath.Dir(o.cohort), "plugins"), o.file, o.threads)
	path := filepath.Join(dir, "cohort.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "out")
	cmd := exec.Command(o.cohort, "run", "--config", path, "--ranks", "1", "--epochs", strconv.Itoa(o.epochs), "--out", out)
	cmd.Dir = root
	if _, err := runLogged(o, cmd); err != nil {
		return nil, err
	}
	sum, err := record.ReadSummary(filepath.Join(out, record.SummaryFile))
	if err != nil {
		return nil, err
	}
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != o.epochs {
		return nil, fmt.Errorf("cohort run: status %q, %d of %d epochs: %s", sum.Status, len(sum.Epochs), o.epochs, sum.Error)
	}
	var s []float64
	for _, e := range sum.Epochs {
		s = append(s, round4(e.Seconds))
	}
	return s, nil
}

// loopSide runs the plain loop and returns its epochs' seconds.
func loopSide(o options, root string) ([]float64, error) {
	cmd := exec.Command(o.python, filepath.Join(root, "bench", "pytorch", "ref_loop.py"), o.file, strconv.Itoa(o.epochs), strconv.Itoa(o.threads))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "shared", "python"), "PYTHONDONTWRITEBYTECODE=1")
	out, err := runLogged(o, cmd)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var got struct {
		EpochS []float64 `json:"epoch_s"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil || len(got.EpochS) != o.epochs {
		return nil, fmt.Errorf("the plain loop's output %q: %v", lines[len(lines)-1], err)
	}
	for i, v := range got.EpochS {
		got.EpochS[i] = round4(v)
	}
	return got.EpochS, nil
}

func runLogged(o options, cmd *exec.Cmd) (string, error) {
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	if o.verbose {
		fmt.Fprintf(os.Stderr, "%s (%.1fs)\n%s", strings.Join(cmd.Args, " "), time.Since(start).Seconds(), buf.String())
	}
	if err != nil {
		out := buf.String()
		if len(out) > 4000 {
			out = out[len(out)-4000:]
		}
		return "", fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return buf.String(), nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round4(v float64) float64 { return float64(int64(v*1e4+0.5)) / 1e4 }
