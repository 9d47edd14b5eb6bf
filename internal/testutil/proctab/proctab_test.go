package proctab

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// List shows this process with its parent and command line, and a child
// and its own child are this process's descendants.
func TestListAndDescendants(t *testing.T) {
	child := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })

	var below []Proc
	for range 100 { // the grandchild takes a moment to appear
		ps := List()
		i := slices.IndexFunc(ps, func(p Proc) bool { return p.PID == os.Getpid() })
		if i < 0 {
			t.Fatal("List does not show this process")
		}
		if me := ps[i]; me.PPID != os.Getppid() || len(me.Args) == 0 || filepath.Base(me.Args[0]) != filepath.Base(os.Args[0]) || me.Zombie() {
			t.Fatalf("this process reads as %+v", me)
		}
		if below = Descendants(ps, os.Getpid()); len(below) >= 2 {
			break
		}
		exec.Command("sleep", "0.02").Run()
	}
	if len(below) != 2 || below[0].PID != child.Process.Pid || below[1].PPID != child.Process.Pid || filepath.Base(below[1].Args[0]) != "sleep" {
		t.Fatalf("descendants %+v: want the shell (pid %d) and its sleep", below, child.Process.Pid)
	}
}

// Rollup reads a live process's figures, refuses one that is gone, and
// names a figure asked for that the file lacks.
func TestRollup(t *testing.T) {
	m, err := Rollup(os.Getpid(), "Pss", "Pss_Anon")
	if err != nil || m["Pss"] <= 0 || m["Pss_Anon"] <= 0 || m["Pss_Anon"] > m["Pss"] {
		t.Fatalf("this process: %v, %v", m, err)
	}
	if _, err := Rollup(1 << 30); err == nil {
		t.Fatal("a pid that does not exist reads without an error")
	}
	if _, err := Rollup(os.Getpid(), "No_Such_Figure"); err == nil || !strings.Contains(err.Error(), "No_Such_Figure") {
		t.Fatalf("a missing figure: %v, want an error naming it", err)
	}
}
