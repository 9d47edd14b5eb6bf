package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// A worker's temporary files, its plugins' included, live in a directory
// of its own: cohort-worker-<pid>-<random> in TMPDIR, which the worker
// process takes as its TMPDIR and passes on to its plugins. Most are
// go-plugin's unix sockets: each plugin's, and the worker's own for the
// averager's relay. A process removes its socket when it exits, not when
// it is killed, and a worker's plugins die with it; so the worker removes
// its directory at its end, the launcher that reaps a killed worker
// removes it then (removeWorkerTemp), and a worker starting sweeps those
// of workers no longer running (sweepWorkerTemps), as it does their
// arenas.
const workerTempPrefix = "cohort-worker-"

// useWorkerTemp sweeps what dead workers left, creates this worker's
// directory and makes it the process's TMPDIR; cleanup removes it and puts
// the TMPDIR before back.
func useWorkerTemp(log hclog.Logger) (cleanup func(), err error) {
	sweepWorkerTemps(log)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", workerTempPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("the worker's temporary directory: %w", err)
	}
	prev, had := os.LookupEnv("TMPDIR")
	restore := func() {
		if had {
			os.Setenv("TMPDIR", prev)
		} else {
			os.Unsetenv("TMPDIR")
		}
	}
	if err := os.Setenv("TMPDIR", dir); err != nil {
		os.Remove(dir)
		return nil, err
	}
	return func() { restore(); os.RemoveAll(dir) }, nil
}

// workerTempOwner is the pid a worker directory's name records.
func workerTempOwner(name string) (int, bool) {
	rest, ok := strings.CutPrefix(filepath.Base(name), workerTempPrefix)
	if !ok {
		return 0, false
	}
	pidText, _, ok := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidText)
	return pid, ok && err == nil && pid > 0
}

// removeWorkerTemp removes the temporary directory of the worker with
// process id pid, once the launcher has reaped it.
func removeWorkerTemp(pid int) error {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("%s%d-*", workerTempPrefix, pid)))
	var errs []error
	for _, d := range dirs {
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

// sweepWorkerTemps removes the directories of workers that no longer run.
// One whose pid another process has taken since is left alone: its owner
// cannot be told from the name.
func sweepWorkerTemps(log hclog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), workerTempPrefix+"*"))
	for _, d := range dirs {
		pid, ok := workerTempOwner(d)
		if !ok || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			log.Warn("removing the temporary files of a worker that is gone", "path", d, "error", err)
			continue
		}
		log.Info("removed the temporary files of a worker that is gone", "path", d)
	}
}
