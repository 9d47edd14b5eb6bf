package proctab

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
