package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/worker"
)

// The harness is the runs' launcher, as an operator's or Slurm's would
// be: it starts the coordinator and a worker per rank, reaps them, and
// cleans up after a killed worker as `cohort run` does (its TMPDIR
// directory, its arena). The workers outlive a killed coordinator, so a
// coordinator started again on the same address takes them back.

// secret is every run's secret, given to its processes in their
// environment.
const secret = "chaos-soak-secret-0123456789abcdef"

// env is the environment of r's processes.
func (r *run) env() []string {
	return append(os.Environ(), "TMPDIR="+r.tmp, "COHORT_SECRET="+secret, "COHORT_SECRET_FILE=")
}

// workerProc is one rank's worker process.
type workerProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func (w *workerProc) gone() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// startWorkers starts a worker for each rank that has none running: all
// of them for a new run, a killed one's rank when its coordinator comes
// back. Each runs in its rank's host and writes its output to rank-<r>.log
// in the run's directory.
func (r *run) startWorkers() error {
	for rank := range uint32(ranks) {
		if w := r.workers[rank]; w != nil && !w.gone() {
			continue
		}
		log, err := os.OpenFile(filepath.Join(r.dir, fmt.Sprintf("rank-%d.log", rank)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		cmd := r.h.bed.Command(int(rank)+1, r.h.bin, "worker", "--coordinator", r.control, "--rank", strconv.Itoa(int(rank)),
			"--world", strconv.Itoa(ranks), "--config", r.cfg)
		cmd.Env, cmd.Stdout, cmd.Stderr = r.env(), log, log
		if err := cmd.Start(); err != nil {
			log.Close()
			return fmt.Errorf("starting the worker of rank %d: %w", rank, err)
		}
		w := &workerProc{cmd: cmd, exited: make(chan struct{})}
		r.workers[rank] = w
		go func() {
			defer close(w.exited)
			cmd.Wait()
			log.Close()
			if st, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				r.cleanUpAfter(cmd.Process.Pid)
			}
		}()
	}
	return nil
}

// cleanUpAfter removes what a worker killed by a signal could not: its
// directory in the run's TMPDIR and its arena.
func (r *run) cleanUpAfter(pid int) {
	dirs, _ := filepath.Glob(filepath.Join(r.tmp, fmt.Sprintf("cohort-worker-%d-*", pid)))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
	worker.SweepArenas("", hclog.NewNullLogger())
}

// killWorkers ends every worker still running (a run that hung, or the
// soak's end) and waits for them.
func (r *run) killWorkers() {
	for _, w := range r.workers {
		if !w.gone() {
			w.cmd.Process.Kill()
		}
	}
	r.waitWorkers(10 * time.Second)
}

// waitWorkers waits up to within for every worker to exit, and reports
// whether they all did.
func (r *run) waitWorkers(within time.Duration) bool {
	deadline := time.After(within)
	for _, w := range r.workers {
		select {
		case <-w.exited:
		case <-deadline:
			return false
		}
	}
	return true
}

// liveWorkers counts the workers running.
func (r *run) liveWorkers() int {
	n := 0
	for _, w := range r.workers {
		if !w.gone() {
			n++
		}
	}
	return n
}
