package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// A worker's temporary directory becomes its TMPDIR; a starting worker
// sweeps those of workers that are gone and leaves live ones' and anything
// else; the launcher's removeWorkerTemp takes one worker's alone.
func TestWorkerTempDirs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead, live := gone.Process.Pid, os.Getppid()
	mk := func(name string) {
		if err := os.MkdirAll(filepath.Join(tmp, name, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{
		fmt.Sprintf("cohort-worker-%d-1", dead), fmt.Sprintf("cohort-worker-%d-2", dead),
		fmt.Sprintf("cohort-worker-%d-1", live), "cohort-worker-x-1", "other",
	} {
		mk(n)
	}
	left := func() []string {
		ents, _ := os.ReadDir(tmp)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		slices.Sort(out)
		return out
	}
	cleanup, err := useWorkerTemp(hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	own := os.TempDir()
	if filepath.Dir(own) != tmp || !slices.Contains(left(), filepath.Base(own)) {
		t.Fatalf("TMPDIR is %s, want a new directory in %s", own, tmp)
	}
	want := []string{fmt.Sprintf("cohort-worker-%d-1", live), filepath.Base(own), "cohort-worker-x-1", "other"}
	slices.Sort(want)
	if got := left(); !slices.Equal(got, want) {
		t.Fatalf("after the sweep: %q, want %q", got, want)
	}
	cleanup()
	if os.TempDir() != tmp {
		t.Fatalf("TMPDIR after cleanup: %s, want %s back", os.TempDir(), tmp)
	}
	mk(fmt.Sprintf("cohort-worker-%d-3", dead))
	if err := removeWorkerTemp(live); err != nil {
		t.Fatal(err)
	}
	want = []string{fmt.Sprintf("cohort-worker-%d-3", dead), "cohort-worker-x-1", "other"}
	if got := left(); !slices.Equal(got, want) {
		t.Fatalf("after removing one worker's: %q, want %q", got, want)
	}
}
