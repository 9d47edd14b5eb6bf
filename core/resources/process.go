package resources

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, which the kernel
// fixes at 100 for user space whatever its internal tick rate.
const userHZ = 100

// Process names a process to sample: a rank's worker core or one of its
// plugins.
type Process struct {
	Role string // "worker", "trainer", "averager"
	Name string // the plugin's name; empty for the worker
	PID  int
}

// ProcessUse is one process's reading. A nil field could not be read this
// time.
type ProcessUse struct {
	Process
	// CPUPercent is the process's CPU time (user and system, all its
	// threads) since its previous reading, as a share of one core: a
	// process busy on four cores reads 400.
	CPUPercent *float32
	RSS        *uint64 // bytes resident
}

// procTime is a process's CPU time at a moment.
type procTime struct {
	ticks uint64
	at    time.Time
}

// ParseProcStat reads the CPU time, in clock ticks (USER_HZ), that
// /proc/PID/stat gives a process: utime plus stime, fields 14 and 15. The
// command name in field 2 may hold spaces and parentheses, so fields count
// from its last ')'.
func ParseProcStat(r io.Reader) (uint64, error) {
	src, err := io.ReadAll(io.LimitReader(r, maxLine))
	if err != nil {
		return 0, fmt.Errorf("/proc/PID/stat: %w", err)
	}
	end := bytes.LastIndexByte(src, ')')
	if end < 0 {
		return 0, errors.New("/proc/PID/stat: no command name")
	}
	// After the name: state (field 3), ... utime (14), stime (15).
	f := strings.Fields(string(src[end+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields after the command name, want at least 13", len(f))
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/PID/stat: utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/PID/stat: stime: %w", err)
	}
	return satAdd(utime, stime), nil
}

// SampleProcesses reads each process's CPU share since its previous
// reading (nil on the first, which sets the baseline) and its resident
// memory. A process that has ended reads as nil fields; its baseline is
// dropped.
func (s *Sampler) SampleProcesses(ps []Process) []ProcessUse {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs == nil {
		s.procs = map[int]procTime{}
	}
	now := time.Now()
	seen := make(map[int]bool, len(ps))
	out := make([]ProcessUse, 0, len(ps))
	for _, p := range ps {
		u := ProcessUse{Process: p}
		if p.PID <= 0 {
			out = append(out, u)
			continue
		}
		seen[p.PID] = true
		dir := filepath.Join(s.proc, strconv.Itoa(p.PID))
		if t, err := readWith(filepath.Join(dir, "stat"), ParseProcStat); s.ok("process stat", err) {
			if prev, ok := s.procs[p.PID]; ok && t >= prev.ticks && now.After(prev.at) {
				pct := float32(100 * float64(t-prev.ticks) / userHZ / now.Sub(prev.at).Seconds())
				u.CPUPercent = &pct
			}
			s.procs[p.PID] = procTime{ticks: t, at: now}
		}
		if rss, err := readWith(filepath.Join(dir, "statm"), statmRSS); s.ok("process statm", err) {
			u.RSS = &rss
		}
		out = append(out, u)
	}
	for pid := range s.procs {
		if !seen[pid] {
			delete(s.procs, pid)
		}
	}
	return out
}
