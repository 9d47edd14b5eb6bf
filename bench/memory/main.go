// Command memory runs cohort's default configuration (`cohort run` without
// a config file: 4 ranks of the libtorch MLP on Fashion-MNIST) and reports
// the most memory its processes held at once: the sum of the PSS of
// `cohort run` (which holds the coordinator), every worker and every
// plugin, read from /proc/PID/smaps_rollup every -interval. PSS splits
// each shared page among the processes that map it, so the sum counts
// once what the ranks share (libtorch's code, the host's one copy of the
// data, the arenas) and the sum is the run's footprint. It prints one JSON
// line:
//
//	{"bench": "memory", "total_pss_mb": ..., "trainer_pss_mb": ..., ...}
//
// trainer_pss_mb is the trainers' part of the same sample.
//
//	go run ./bench/memory -cohort bin/cohort
//
// Run it from the repository root (the default configuration's plugin_dir
// is bin/plugins, relative to it).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"
)

func main() {
	bin := flag.String("cohort", "bin/cohort", "the cohort binary")
	interval := flag.Duration("interval", 100*time.Millisecond, "how often the processes are read")
	timeout := flag.Duration("timeout", 10*time.Minute, "longest the run may take")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	res, err := measure(ctx, *bin, *interval)
	if err != nil {
		fmt.Fprintf(os.Stderr, "memory: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("default run: at most %.0f MB PSS in all (%d processes), the trainers %.0f MB of it; %d samples\n",
		res.TotalMB, res.Processes, res.TrainerMB, res.Samples)
	line, err := json.Marshal(res)
	if err != nil {
		panic(err) // a struct of plain fields always marshals
	}
	fmt.Println(string(line))
}

// result is the JSON line: the sample with the largest total.
type result struct {
	Bench     string  `json:"bench"`
	TotalMB   float64 `json:"total_pss_mb"`
	TrainerMB float64 `json:"trainer_pss_mb"`
	Processes int     `json:"processes"`
	Samples   int     `json:"samples"`
	Seconds   float64 `json:"seconds"`
}

// measure runs the default configuration and samples its processes until
// it ends.
func measure(ctx context.Context, bin string, interval time.Duration) (*result, error) {
	dir, err := os.MkdirTemp("", "cohort-memory-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, bin, "run", "--out", filepath.Join(dir, "run"))
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	res := &result{Bench: "memory"}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return nil, fmt.Errorf("cohort run: %w", err)
			}
			res.Seconds = time.Since(start).Seconds()
			if res.Samples == 0 {
				return nil, fmt.Errorf("the run ended before a sample")
			}
			return res, nil
		case <-tick.C:
			total, trainers, n := sampleTree(cmd.Process.Pid)
			res.Samples++
			if total > res.TotalMB {
				res.TotalMB, res.TrainerMB, res.Processes = total, trainers, n
			}
		}
	}
}

// sampleTree sums the PSS of root and every process below it, and of the
// trainer plugins among them, in MB.
func sampleTree(root int) (total, trainers float64, n int) {
	ps := proctab.List()
	for _, p := range append([]proctab.Proc{{PID: root, Args: []string{"cohort"}}}, proctab.Descendants(ps, root)...) {
		if p.Zombie() || len(p.Args) == 0 {
			continue
		}
		m, err := proctab.Rollup(p.PID, "Pss")
		if err != nil {
			continue // it exited while read
		}
		mb := float64(m["Pss"]) / 1024
		total += mb
		n++
		if strings.HasPrefix(filepath.Base(p.Args[0]), "cohort-trainer-") {
			trainers += mb
		}
	}
	return total, trainers, n
}
