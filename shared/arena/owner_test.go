package arena

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// Sweep removes exactly the arenas whose owner is gone: no process has the
// pid, or the one that has it started at another time (the pid was reused).
func TestSweepRemovesArenasOfGoneOwners(t *testing.T) {
	self := os.Getpid()
	start, err := procStart(self)
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	gonePID := exited.Process.Pid
	const rnd = "0123456789abcdef"
	cases := []struct {
		name string
		file string
		dir  bool
		gone bool
	}{
		{name: "live owner", file: fmt.Sprintf("cohort-run-1-r0-%d-%d-%s.arena", self, start, rnd)},
		{name: "exited owner", file: fmt.Sprintf("cohort-run-1-r1-%d-%d-%s.arena", gonePID, start, rnd), gone: true},
		{name: "pid reused", file: fmt.Sprintf("cohort-run-1-r2-%d-%d-%s.arena", self, start+1, rnd), gone: true},
		{name: "start time not recorded", file: fmt.Sprintf("cohort-run-1-r3-%d-0-%s.arena", gonePID, rnd)},
		{name: "another prefix", file: fmt.Sprintf("other-r0-%d-%d-%s.arena", gonePID, start, rnd)},
		{name: "not an arena", file: fmt.Sprintf("cohort-run-1-r0-%d-%d-%s.txt", gonePID, start, rnd)},
		{name: "pid only (an older name)", file: fmt.Sprintf("cohort-r0-%d-%s.arena", gonePID, rnd)},
		{name: "a directory", file: fmt.Sprintf("cohort-run-1-r4-%d-%d-%s.arena", gonePID, start, rnd), dir: true},
	}
	dir := t.TempDir()
	var want []string
	for _, tc := range cases {
		p := filepath.Join(dir, tc.file)
		if tc.dir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		if tc.gone {
			want = append(want, p)
		}
	}
	removed, err := Sweep(dir, "cohort")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	for _, tc := range cases {
		_, err := os.Stat(filepath.Join(dir, tc.file))
		if kept := err == nil; kept == tc.gone {
			t.Errorf("%s: kept %v, want %v", tc.name, kept, !tc.gone)
		}
	}
}

// An arena Create makes names its owner, and Sweep leaves it while the
// owner runs.
func TestCreateNamesItsOwner(t *testing.T) {
	if _, err := procStart(os.Getpid()); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	dir := t.TempDir()
	l, err := Pack([]Entry{{Name: "w", DType: F32, Shape: []int64{4}, Role: Parameter}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := Create(dir, "cohort-20260101T000000Z-ab12-r3", l)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Remove()
	pid, start, ok := parseName(filepath.Base(a.Path()), "cohort")
	if own, _ := procStart(os.Getpid()); !ok || pid != os.Getpid() || start != own {
		t.Fatalf("name %q records pid %d start %d (ok %v); this process is %d, started %d", a.Path(), pid, start, ok, os.Getpid(), own)
	}
	if removed, err := Sweep(dir, "cohort"); err != nil || len(removed) != 0 {
		t.Fatalf("swept %v, %v; the owner runs", removed, err)
	}
}
