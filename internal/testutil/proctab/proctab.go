// Package proctab reads the process table from /proc (Linux): each
// process's pid, parent, state and command line, and its memory figures
// (smaps_rollup), for the benchmarks and tests that look for cohort's
// processes (a rank's worker, its plugins, a peer's ranks). It owns
// nothing else.
package proctab

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Proc is one process.
type Proc struct {
	PID, PPID int
	// State is /proc/PID/stat's state letter: "R", "S", "Z" (exited, not
	// yet reaped) and so on.
	State string
	// Args is the command line; empty for kernel threads and zombies.
	Args []string
}

// Zombie reports whether p has exited and waits for its parent to reap it.
func (p Proc) Zombie() bool { return p.State == "Z" }

// List returns every process /proc shows, by pid. A process that exits
// while it is read is left out.
func List() []Proc {
	entries, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// After the command name, which may hold spaces and parentheses:
		// state ppid ...
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		p := Proc{PID: pid, PPID: ppid, State: f[0]}
		if cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); len(cmdline) > 0 {
			p.Args = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Proc) int { return a.PID - b.PID })
	return out
}

// Descendants returns the processes of ps below root (children, theirs,
// and so on), by pid.
func Descendants(ps []Proc, root int) []Proc {
	in := map[int]bool{root: true}
	var out []Proc
	for changed := true; changed; {
		changed = false
		for _, p := range ps {
			if !in[p.PID] && in[p.PPID] {
				in[p.PID], changed = true, true
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, func(a, b Proc) int { return a.PID - b.PID })
	return out
}

// Rollup reads /proc/PID/smaps_rollup's kB figures by name ("Pss",
// "Pss_Anon", "Pss_Shmem", ...), and fails if one of need is missing.
func Rollup(pid int, need ...string) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var name string
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "%s %d kB", &name, &kb); n == 2 {
			out[strings.TrimSuffix(name, ":")] = kb
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range need {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("no %s line in /proc/%d/smaps_rollup", n, pid)
		}
	}
	return out, nil
}
