package main

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// allowedCPUs lists the CPUs this process may run on, in order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read this process's CPU affinity: %w", err)
	}
	var cpus []int
	for c := 0; len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// startOn starts cmd confined to cpus (unconfined when cpus is empty). A
// child inherits the CPU affinity of the OS thread that forks it, and so do
// its own children (cohort's workers and plugins), so the fork happens on a
// thread of its own whose mask is narrowed first; the thread exits with its
// goroutine rather than return to the scheduler with that mask.
func startOn(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		var set unix.CPUSet
		for _, c := range cpus {
			set.Set(c)
		}
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errc <- fmt.Errorf("confine %s to CPUs %v: %w", cmd.Path, cpus, err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// cpuHalves splits cpus into two disjoint halves of equal size when each
// half holds at least need CPUs; ok is false otherwise.
func cpuHalves(cpus []int, need int) (a, b []int, ok bool) {
	h := len(cpus) / 2
	if need < 1 || h < need {
		return nil, nil, false
	}
	return cpus[:h], cpus[h : 2*h], true
}

// cpuList formats CPUs as ranges: "0-3,8".
func cpuList(cpus []int) string {
	s := ""
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if s != "" {
			s += ","
		}
		if j == i {
			s += fmt.Sprint(cpus[i])
		} else {
			s += fmt.Sprintf("%d-%d", cpus[i], cpus[j])
		}
		i = j + 1
	}
	return s
}
