package resources

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
)

// maxLine bounds one line of a /proc file (/proc/stat's intr line runs to
// kilobytes on big hosts).
const maxLine = 1 << 20

// CPUStat is the aggregate "cpu" line of /proc/stat: time spent in each
// state since boot, in clock ticks, summed over all cores. Kernels before
// 2.6.33 give fewer fields; the missing ones are zero.
type CPUStat struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal, Guest, GuestNice uint64
}

// Total is all the time counted. Guest and GuestNice are left out: the
// kernel already counts them in User and Nice.
func (c CPUStat) Total() uint64 {
	return c.User + c.Nice + c.System + c.Idle + c.IOWait + c.IRQ + c.SoftIRQ + c.Steal
}

// IdleTotal is the time not busy: idle and waiting for I/O.
func (c CPUStat) IdleTotal() uint64 { return c.Idle + c.IOWait }

// ParseCPUStat reads /proc/stat's aggregate "cpu" line: the first line
// that starts with "cpu ", with at least the user, nice, system and idle
// fields. Fields past the ten known ones are ignored.
func ParseCPUStat(r io.Reader) (CPUStat, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "cpu" {
			continue
		}
		f = f[1:]
		if len(f) < 4 {
			return CPUStat{}, fmt.Errorf("/proc/stat: cpu line has %d fields, want at least 4", len(f))
		}
		var v [10]uint64
		for i := 0; i < len(f) && i < len(v); i++ {
			n, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return CPUStat{}, fmt.Errorf("/proc/stat: cpu field %d: %w", i+1, err)
			}
			v[i] = n
		}
		return CPUStat{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]}, nil
	}
	if err := sc.Err(); err != nil {
		return CPUStat{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return CPUStat{}, errors.New("/proc/stat: no cpu line")
}

// CPUPercent is the busy share of all cores between two readings, in
// [0, 100]. ok is false when no time passed between them or the counters
// went backwards (the second reading is not later than the first).
func CPUPercent(prev, cur CPUStat) (pct float32, ok bool) {
	total, prevTotal := cur.Total(), prev.Total()
	if total <= prevTotal {
		return 0, false
	}
	dTotal := float64(total - prevTotal)
	// iowait may step backwards on some kernels: keep the sign.
	dIdle := float64(cur.IdleTotal()) - float64(prev.IdleTotal())
	p := 100 * (dTotal - dIdle) / dTotal
	return float32(min(max(p, 0), 100)), true
}

// MemInfo is the host's memory, in bytes, from /proc/meminfo.
type MemInfo struct {
	Total     uint64 // MemTotal
	Available uint64 // MemAvailable: what new work can use without swapping
}

// Used is Total less Available.
func (m MemInfo) Used() uint64 {
	if m.Available > m.Total {
		return 0
	}
	return m.Total - m.Available
}

// ParseMeminfo reads MemTotal and MemAvailable from /proc/meminfo. Before
// Linux 3.14 there is no MemAvailable; MemFree + Buffers + Cached stands in.
func ParseMeminfo(r io.Reader) (MemInfo, error) {
	v, err := kBFields(r, "MemTotal", "MemAvailable", "MemFree", "Buffers", "Cached")
	if err != nil {
		return MemInfo{}, fmt.Errorf("/proc/meminfo: %w", err)
	}
	total, ok := v["MemTotal"]
	if !ok {
		return MemInfo{}, errors.New("/proc/meminfo: no MemTotal")
	}
	avail, ok := v["MemAvailable"]
	if !ok {
		free, ok := v["MemFree"]
		if !ok {
			return MemInfo{}, errors.New("/proc/meminfo: neither MemAvailable nor MemFree")
		}
		avail = satAdd(satAdd(free, v["Buffers"]), v["Cached"])
	}
	return MemInfo{Total: total, Available: avail}, nil
}

// Memory is one process's memory, in bytes, from /proc/PID/smaps_rollup.
type Memory struct {
	RSS     uint64 // resident
	PSS     uint64 // proportional: shared pages divided among their sharers
	Private uint64 // Private_Clean + Private_Dirty
	Shared  uint64 // Shared_Clean + Shared_Dirty
}

var smapsKeys = []string{"Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty"}

// ParseSmapsRollup reads a smaps_rollup file (Linux 4.14 and later). Every
// one of Rss, Pss, Private_Clean, Private_Dirty, Shared_Clean and
// Shared_Dirty must be there.
func ParseSmapsRollup(r io.Reader) (Memory, error) {
	v, err := kBFields(r, smapsKeys...)
	if err != nil {
		return Memory{}, fmt.Errorf("smaps_rollup: %w", err)
	}
	for _, k := range smapsKeys {
		if _, ok := v[k]; !ok {
			return Memory{}, fmt.Errorf("smaps_rollup: no %s", k)
		}
	}
	return Memory{
		RSS:     v["Rss"],
		PSS:     v["Pss"],
		Private: satAdd(v["Private_Clean"], v["Private_Dirty"]),
		Shared:  satAdd(v["Shared_Clean"], v["Shared_Dirty"]),
	}, nil
}

// ReadSmapsRollup reads and parses the smaps_rollup file at path.
func ReadSmapsRollup(path string) (Memory, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return Memory{}, err
	}
	return ParseSmapsRollup(bytes.NewReader(src))
}

// ParseStatm reads the resident size, in pages, from a /proc/PID/statm
// line (size resident shared text lib data dt). The periodic samples
// take RSS from here: smaps_rollup walks the process's page tables under
// its mmap lock, which on a trainer holding hundreds of MB cost the host's
// workers 1.6% of both cores (perf) at a sample every 500 ms.
func ParseStatm(r io.Reader) (uint64, error) {
	src, err := io.ReadAll(io.LimitReader(r, maxLine))
	if err != nil {
		return 0, fmt.Errorf("statm: %w", err)
	}
	f := strings.Fields(string(src))
	if len(f) < 2 {
		return 0, fmt.Errorf("statm: %d fields, want at least 2", len(f))
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("statm: resident: %w", err)
	}
	return pages, nil
}

// statmRSS is ParseStatm's resident size in bytes.
func statmRSS(r io.Reader) (uint64, error) {
	pages, err := ParseStatm(r)
	if err != nil {
		return 0, err
	}
	hi, lo := bits.Mul64(pages, uint64(os.Getpagesize()))
	if hi != 0 {
		return 0, fmt.Errorf("statm: %d resident pages overflow", pages)
	}
	return lo, nil
}

// SelfMemory is this process's memory.
func SelfMemory() (Memory, error) { return ReadSmapsRollup("/proc/self/smaps_rollup") }

// ProcessMemory is the memory of process pid (a plugin subprocess, say).
// Reading another user's process needs privilege.
func ProcessMemory(pid int) (Memory, error) {
	return ReadSmapsRollup("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
}

// kBFields reads lines of the form "Name:   123 kB" and returns, in bytes,
// the values of the wanted names it finds. Lines that are not "Name: ..."
// and names not wanted are skipped; a wanted name given twice, or not as
// a count of kB, is an error.
func kBFields(r io.Reader, wanted ...string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(wanted))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || !slices.Contains(wanted, name) {
			continue
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s given twice", name)
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return nil, fmt.Errorf("%s: %q is not a count of kB", name, strings.TrimSpace(rest))
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || n > math.MaxUint64/1024 {
			return nil, fmt.Errorf("%s: %q is not a count of kB", name, f[0])
		}
		out[name] = n * 1024
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// satAdd is a + b, or the largest uint64 where that would wrap.
func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
