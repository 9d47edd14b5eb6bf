// Command soak runs cohort's default configuration (`cohort run` without a
// config file: 4 ranks, the libtorch MLP, CPU averaging, an evaluation
// every epoch) for many epochs and checks that no process grows with the
// length of the run. After every epoch it reads /proc/PID/smaps_rollup of
// `cohort run` (which holds the coordinator), each rank's worker and each
// plugin, and compares each process's figures from -first to its last ones
// (the last epoch whose sample found every process). It fails when any
// process's own memory or PSS grew by more than -max-growth along the
// least-squares line through its samples: a leak climbs every epoch and
// moves that line, where one sample taken as the garbage collector had
// just run, or not yet, moves a figure by a few hundred kB either way and
// decided a comparison of two samples.
//
// It prints two figures a process: its PSS, and its own memory, the part of
// the PSS that is its anonymous memory and its share of shared memory (the
// arena): Pss_Anon + Pss_Shmem. PSS, the figure, is gated at
// -max-growth. It also holds the process's share of the files it maps (its
// binary, libtorch), and that share moves when other processes map or
// unmap the same files: on a shared machine a trainer's PSS fell from 385
// to 335 MB as libtorch's other users came and went. A leak is memory the
// process holds, which the second figure counts; it is gated at
// -max-growth too, once its fitted rise also passes -min-rise-mb. Below
// that a Go process's own memory moves without a leak: its runtime keeps
// heap pages resident up to about its heap goal, and reuses pages it had
// released, so a worker whose live heap (runtime/metrics'
// /gc/heap/live:bytes) stayed at 2.60-2.65 MB over 200 epochs gained
// 0.3-0.4 MB of resident heap in one step midway, which a 7 MB process
// reads as +6%. A leak of 5 kB an epoch passes 1 MB in 200 epochs.
//
//	go run ./bench/soak -cohort bin/cohort              # 200 epochs
//	go run ./bench/soak -cohort bin/cohort -epochs 30   # a quicker look
//
// Run it from the repository root (the default configuration's plugin_dir
// is bin/plugins, relative to it).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"
)

func main() {
	bin := flag.String("cohort", "bin/cohort", "the cohort binary")
	epochs := flag.Int("epochs", 200, "epochs to train")
	first := flag.Int("first", 10, "the epoch of the first sample")
	maxGrowth := flag.Float64("max-growth", 0.05, "largest growth of a process's PSS and own memory allowed between -first and the end, as a fraction")
	minRise := flag.Float64("min-rise-mb", 1, "own memory fails -max-growth only when it also rose by more than this many MB")
	out := flag.String("out", "", "the run's output directory (default: a temporary one, removed after)")
	timeout := flag.Duration("timeout", 2*time.Hour, "longest the run may take")
	flag.Parse()
	if *first < 1 || *first >= *epochs {
		fmt.Fprintf(os.Stderr, "soak: -first %d must lie in [1, -epochs %d)\n", *first, *epochs)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	res, err := soak(ctx, *bin, *out, *epochs, *first)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
	res.MaxGrowthAllowed = *maxGrowth
	res.MinOwnRiseMB = *minRise
	fmt.Printf("epoch %d -> epoch %d (sampled figures; growth along each one's fitted line)\n", res.FirstEpoch, res.LastEpoch)
	for _, p := range res.Processes {
		fmt.Printf("%-31s pid %-7d PSS %6.1f -> %6.1f MB (%+6.2f%%)  own %6.1f -> %6.1f MB (%+6.2f%%)\n",
			p.Name, p.PID, p.FirstMB, p.LastMB, 100*p.PSSGrowth, p.FirstOwnMB, p.LastOwnMB, 100*p.Growth)
		if p.PSSGrowth > *maxGrowth || p.Growth > *maxGrowth && p.OwnRiseMB > *minRise {
			res.Grew = append(res.Grew, p.Name)
		}
		res.MaxGrowth = max(res.MaxGrowth, p.Growth)
	}
	line, err := json.Marshal(res)
	if err != nil {
		panic(err) // a struct of plain fields always marshals
	}
	fmt.Println(string(line))
	if len(res.Grew) > 0 {
		fmt.Fprintf(os.Stderr, "soak: %d process(es) grew by more than %.0f%%: %v\n", len(res.Grew), 100**maxGrowth, res.Grew)
		os.Exit(1)
	}
}

// result is the JSON line.
type result struct {
	Epochs           int       `json:"epochs"`
	FirstEpoch       int       `json:"first_epoch"`
	LastEpoch        int       `json:"last_epoch"`
	Seconds          float64   `json:"seconds"`
	Processes        []process `json:"processes"`
	MaxGrowth        float64   `json:"max_growth"`
	MaxGrowthAllowed float64   `json:"max_growth_allowed"`
	MinOwnRiseMB     float64   `json:"min_own_rise_mb"`
	// Grew names the processes past the limit; empty when the soak holds.
	Grew []string `json:"grew"`
}

type process struct {
	Name       string  `json:"name"`
	PID        int     `json:"pid"`
	FirstMB    float64 `json:"first_pss_mb"`
	LastMB     float64 `json:"last_pss_mb"`
	FirstOwnMB float64 `json:"first_own_mb"`
	LastOwnMB  float64 `json:"last_own_mb"`
	// PSSGrowth and Growth (the own memory's) are read off the fitted
	// lines, from the first sampled epoch to the last; the gate reads both.
	PSSGrowth float64 `json:"pss_growth"`
	Growth    float64 `json:"growth"`
	// OwnRiseMB is the own memory's rise along its fitted line.
	OwnRiseMB float64 `json:"own_rise_mb"`
}

// epochLine is `cohort run`'s line at an epoch's end; its progress lines
// within an epoch ("epoch 3/200  41%  ...") do not match.
var epochLine = regexp.MustCompile(`^epoch (\d+)/\d+ +loss `)

// soak runs `cohort run` for epochs epochs, sampling its processes after
// each one from first on.
func soak(ctx context.Context, bin, out string, epochs, first int) (*result, error) {
	if out == "" {
		dir, err := os.MkdirTemp("", "cohort-soak-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		out = filepath.Join(dir, "run")
	}
	cmd := exec.CommandContext(ctx, bin, "run", "--epochs", fmt.Sprint(epochs), "--out", out)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	res := &result{Epochs: epochs, FirstEpoch: first, Grew: []string{}}
	var firstSample, lastSample map[string]sample
	var series []map[string]sample // every sample from first on, in order
	var epochsSeen []float64
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		m := epochLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var epoch int
		fmt.Sscan(m[1], &epoch)
		if epoch < first {
			continue
		}
		s := sampleTree(cmd.Process.Pid)
		if epoch%10 == 0 {
			// Where the figures stand every 10 epochs: a leak climbs
			// steadily, a warm-up levels off.
			fmt.Fprintf(os.Stderr, "%s\n  PSS/own MB:%s\n", line, trace(s))
		}
		switch {
		case epoch == first:
			firstSample = s
		case firstSample != nil && sameProcesses(firstSample, s):
			lastSample, res.LastEpoch = s, epoch
		default:
			continue
		}
		series, epochsSeen = append(series, s), append(epochsSeen, float64(epoch))
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("cohort run (out %s): %w", out, err)
	}
	res.Seconds = time.Since(start).Seconds()
	if firstSample == nil || lastSample == nil {
		return nil, fmt.Errorf("cohort run (out %s) printed no epoch %d, or no later one with the same processes", out, first)
	}
	for name, f := range firstSample {
		l := lastSample[name]
		var pss, own []float64
		for _, s := range series {
			pss, own = append(pss, float64(s[name].pss)), append(own, float64(s[name].own))
		}
		pssGrowth, _ := trend(epochsSeen, pss)
		ownGrowth, ownRise := trend(epochsSeen, own)
		res.Processes = append(res.Processes, process{Name: name, PID: f.pid,
			FirstMB: mb(f.pss), LastMB: mb(l.pss), PSSGrowth: pssGrowth,
			FirstOwnMB: mb(f.own), LastOwnMB: mb(l.own), Growth: ownGrowth, OwnRiseMB: ownRise / 1024})
	}
	slices.SortFunc(res.Processes, func(a, b process) int { return a.PID - b.PID })
	return res, nil
}

func mb(kb int64) float64 { return float64(kb) / 1024 }

// trend is the growth of the least-squares line through (x, y) from its
// first x to its last, as a fraction, fit(last)/fit(first) - 1, and in y's
// units, fit(last) - fit(first). Fewer than two distinct x, or a line that
// starts at or below zero, give 0.
func trend(x, y []float64) (growth, rise float64) {
	n := float64(len(x))
	if len(x) < 2 || len(x) != len(y) {
		return 0, 0
	}
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx, sy, sxx, sxy = sx+x[i], sy+y[i], sxx+x[i]*x[i], sxy+x[i]*y[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, 0
	}
	slope := (n*sxy - sx*sy) / d
	at := func(v float64) float64 { return (sy - slope*sx + slope*n*v) / n }
	start, end := at(x[0]), at(x[len(x)-1])
	if start <= 0 {
		return 0, 0
	}
	return end/start - 1, end - start
}

// trace is a sample's figures, by pid.
func trace(s map[string]sample) string {
	names := slices.Collect(maps.Keys(s))
	slices.SortFunc(names, func(a, b string) int { return s[a].pid - s[b].pid })
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, " %s %.1f/%.1f,", n, mb(s[n].pss), mb(s[n].own))
	}
	return strings.TrimSuffix(b.String(), ",")
}

// sample is one process's figures, in kB: its PSS, and its own memory
// (Pss_Anon + Pss_Shmem).
type sample struct {
	pid      int
	pss, own int64
}

// sampleTree reads the PSS of root and every process below it, by name.
func sampleTree(root int) map[string]sample {
	ps := proctab.List()
	out := map[string]sample{}
	for _, p := range append([]proctab.Proc{{PID: root, Args: []string{"cohort", "run"}}}, proctab.Descendants(ps, root)...) {
		if p.Zombie() || len(p.Args) == 0 {
			continue
		}
		m, err := proctab.Rollup(p.PID, "Pss", "Pss_Anon", "Pss_Shmem")
		if err != nil {
			continue // it exited while read
		}
		out[name(ps, p, root)] = sample{pid: p.PID, pss: m["Pss"], own: m["Pss_Anon"] + m["Pss_Shmem"]}
	}
	return out
}

// name says what a process of the run is: "cohort run", "rank R worker"
// or "rank R <plugin binary>".
func name(ps []proctab.Proc, p proctab.Proc, root int) string {
	if p.PID == root {
		return "cohort run"
	}
	if r := rankOf(p.Args); r != "" {
		return "rank " + r + " worker"
	}
	for _, q := range ps {
		if q.PID == p.PPID {
			if r := rankOf(q.Args); r != "" {
				return "rank " + r + " " + filepath.Base(p.Args[0])
			}
		}
	}
	return fmt.Sprintf("%s (%d)", filepath.Base(p.Args[0]), p.PID)
}

// rankOf is the --rank argument of a `cohort worker` command line.
func rankOf(args []string) string {
	for i, a := range args {
		if a == "--rank" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// sameProcesses reports whether b holds a's processes, each by the same
// pid: a process replaced since (a plugin restarted) is not the one whose
// growth the soak measures.
func sameProcesses(a, b map[string]sample) bool {
	for name, s := range a {
		if t, ok := b[name]; !ok || t.pid != s.pid {
			return false
		}
	}
	return true
}
