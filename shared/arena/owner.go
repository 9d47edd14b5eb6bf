package arena

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// An arena's file name says who owns it: <prefix>-<pid>-<start>-<random>.arena,
// start being the owner's start time (clock ticks since boot, field 22 of
// /proc/PID/stat). A pid alone is reused; pid and start time name one
// process for as long as the machine is up, and /dev/shm does not outlive
// a reboot. So whoever finds an arena can tell, from its name and /proc
// alone, whether its owner still runs.

const arenaExt = ".arena"

// procStart is the start time of process pid, from /proc/PID/stat.
// os.ErrNotExist means no such process.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses of its own: count fields after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	const startField = 22 - 3 // fields 3.. follow the name
	if len(f) <= startField {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	return strconv.ParseUint(f[startField], 10, 64)
}

// ownerTag is this process's <pid>-<start> for arena names; start is 0
// where /proc cannot say, and Sweep leaves such arenas alone.
func ownerTag() string {
	pid := os.Getpid()
	start, err := procStart(pid)
	if err != nil {
		start = 0
	}
	return fmt.Sprintf("%d-%d", pid, start)
}

// parseName returns the owner an arena file name records, and whether the
// name follows Create's scheme under prefix.
func parseName(name, prefix string) (pid int, start uint64, ok bool) {
	rest, found := strings.CutPrefix(name, prefix+"-")
	if !found {
		return 0, 0, false
	}
	rest, found = strings.CutSuffix(rest, arenaExt)
	if !found {
		return 0, 0, false
	}
	// Parse from the right: the prefix's own text (a run id, a rank) may
	// hold dashes.
	parts := strings.Split(rest, "-")
	if len(parts) < 3 {
		return 0, 0, false
	}
	n := len(parts)
	if len(parts[n-1]) != 16 {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(parts[n-3])
	s, err2 := strconv.ParseUint(parts[n-2], 10, 64)
	if err1 != nil || err2 != nil || p <= 0 {
		return 0, 0, false
	}
	return p, s, true
}

// Owner returns the pid an arena file name (under prefix) records, and
// whether the name follows Create's scheme.
func Owner(name, prefix string) (pid int, ok bool) {
	pid, _, ok = parseName(name, prefix)
	return pid, ok
}

// OwnerGone reports whether the arena file name (under prefix) names an
// owner that no longer runs: no process has its pid, or the one that has
// started at another time. It reports false for a name that is not an
// arena's, an owner whose start time was not recorded, and whenever /proc
// cannot tell.
func OwnerGone(name, prefix string) bool {
	pid, start, ok := parseName(name, prefix)
	if !ok || start == 0 {
		return false
	}
	got, err := procStart(pid)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true
	case err != nil:
		return false
	}
	return got != start
}

// Sweep removes the arenas in dir (DefaultDir when empty) whose names
// follow Create's scheme under prefix and whose owner is gone (see
// OwnerGone): what a process killed before it could remove its arena left
// behind. It returns the paths it removed; an arena it cannot remove is an
// error, and the sweep goes on.
func Sweep(dir, prefix string) ([]string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if _, err := procStart(os.Getpid()); err != nil {
		// Without /proc no owner can be judged.
		return nil, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sweep arenas: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		if !e.Type().IsRegular() || !OwnerGone(e.Name(), prefix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sweep arenas: %w", err))
			continue
		}
		removed = append(removed, path)
	}
	return removed, errors.Join(errs...)
}
