// A CPU quota for one rank of a run, the same on cohort's side and on
// DDP's: the slow rank of the heterogeneous comparison with DDP, whose
// peer script has no way to slow a rank itself.

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"
)

// quotaPeriod is the cgroup CPU period the quota is a share of: short, so
// the held rank runs often in short slices, as a slower device would,
// rather than for a slice and then not at all for most of 100 ms (which a
// collective every step would pay for in full).
const quotaPeriod = 10_000 // µs

// cpuQuota is a cgroup (v2, else v1's cpu controller) holding processes to
// a fraction of one CPU.
type cpuQuota struct {
	dir    string
	procs  string // the cgroup's process list
	parent string // the parent's, where processes go back on close
}

// newCPUQuota makes a cgroup named name that holds its processes to cpus
// of one CPU. It needs root and a writable cgroup hierarchy.
func newCPUQuota(name string, cpus float64) (*cpuQuota, error) {
	quota := int(cpus * quotaPeriod)
	if quota < 1000 {
		return nil, fmt.Errorf("a CPU quota of %g CPUs is below the kernel's 1 ms", cpus)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		q := &cpuQuota{dir: filepath.Join("/sys/fs/cgroup", name), parent: "/sys/fs/cgroup/cgroup.procs"}
		q.procs = filepath.Join(q.dir, "cgroup.procs")
		if err := q.make(map[string]string{"cpu.max": fmt.Sprintf("%d %d", quota, quotaPeriod)}); err != nil {
			return nil, err
		}
		return q, nil
	}
	root := "/sys/fs/cgroup/cpu"
	q := &cpuQuota{dir: filepath.Join(root, name), parent: filepath.Join(root, "cgroup.procs")}
	q.procs = filepath.Join(q.dir, "cgroup.procs")
	if err := q.make(map[string]string{"cpu.cfs_period_us": strconv.Itoa(quotaPeriod), "cpu.cfs_quota_us": strconv.Itoa(quota)}); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *cpuQuota) make(files map[string]string) error {
	if err := os.Mkdir(q.dir, 0o755); err != nil {
		return fmt.Errorf("make cgroup %s: %w", q.dir, err)
	}
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	slices.Sort(keys) // v1: the period before the quota
	for _, k := range keys {
		if err := os.WriteFile(filepath.Join(q.dir, k), []byte(files[k]), 0o644); err != nil {
			os.Remove(q.dir)
			return fmt.Errorf("set %s of cgroup %s: %w", k, q.dir, err)
		}
	}
	return nil
}

// add moves pid (all its threads) into the cgroup; its later children are
// born there.
func (q *cpuQuota) add(pid int) error {
	if err := os.WriteFile(q.procs, []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("move pid %d into cgroup %s: %w", pid, q.dir, err)
	}
	return nil
}

// close moves what is left back to the parent and removes the cgroup.
func (q *cpuQuota) close() error {
	b, _ := os.ReadFile(q.procs)
	for _, f := range strings.Fields(string(b)) {
		os.WriteFile(q.parent, []byte(f), 0o644)
	}
	var err error
	for range 50 { // a process just moved out may hold it a moment
		if err = os.Remove(q.dir); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", q.dir, err)
}

// cohortRankProcs picks the worker of rank under a `cohort run` and every
// process below it (its plugins).
func cohortRankProcs(rank int) func([]proctab.Proc) []int {
	return func(ps []proctab.Proc) []int {
		worker := -1
		for _, p := range ps {
			if i := slices.Index(p.Args, "--rank"); slices.Contains(p.Args, "worker") && i >= 0 && i+1 < len(p.Args) && p.Args[i+1] == strconv.Itoa(rank) {
				worker = p.PID
			}
		}
		if worker < 0 {
			return nil
		}
		out := []int{worker}
		for _, p := range proctab.Descendants(ps, worker) {
			out = append(out, p.PID)
		}
		return out
	}
}

// ddpRankProcs picks rank's process of the DDP peer: the peer starts its
// ranks (multiprocessing spawn children) in rank order, so once all ranks
// are there it is the rank-th by pid.
func ddpRankProcs(rank, ranks int) func([]proctab.Proc) []int {
	return func(ps []proctab.Proc) []int {
		var spawned []int
		for _, p := range ps {
			if strings.Contains(strings.Join(p.Args, " "), "spawn_main") {
				spawned = append(spawned, p.PID)
			}
		}
		if len(spawned) < ranks {
			return nil
		}
		return spawned[rank : rank+1]
	}
}

// holdWhile moves the processes pick finds under root into q as they
// appear, until ctx ends: moved says how many it moved so far, wait waits
// for its goroutine once ctx is done.
func holdWhile(ctx context.Context, q *cpuQuota, root int, pick func([]proctab.Proc) []int) (moved func() int, wait func()) {
	var mu sync.Mutex
	held := map[int]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, pid := range pick(proctab.Descendants(proctab.List(), root)) {
				mu.Lock()
				if !held[pid] && q.add(pid) == nil {
					held[pid] = true
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return len(held) }, func() { <-done }
}

// quotaHook, for runLogged, holds the processes pick finds under the
// started command in q while it runs; it fails the run when it moved none
// (the slow rank would not have been slow).
func quotaHook(q *cpuQuota, pick func([]proctab.Proc) []int) func(pid int) func() error {
	return func(pid int) func() error {
		ctx, cancel := context.WithCancel(context.Background())
		moved, wait := holdWhile(ctx, q, pid, pick)
		return func() error {
			cancel()
			wait()
			if moved() == 0 {
				return fmt.Errorf("no process of the slow rank was found to put under the CPU quota")
			}
			return nil
		}
	}
}
