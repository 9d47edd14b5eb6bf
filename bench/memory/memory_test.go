package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"
)

// TestSampleTree: the sum takes in the processes below the root and
// counts a trainer plugin's PSS in the trainers' part.
func TestSampleTree(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary to stand in for a plugin")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	trainer := filepath.Join(t.TempDir(), "cohort-trainer-test")
	if err := os.WriteFile(trainer, b, 0o700); err != nil {
		t.Fatal(err)
	}
	self, err := proctab.Rollup(os.Getpid(), "Pss")
	if err != nil || self["Pss"] <= 0 {
		t.Fatalf("this process's PSS: %v, %v", self, err)
	}
	cmd := exec.Command(trainer, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// Until the child has exec'd it runs this test's binary.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)); strings.HasPrefix(string(b), trainer+"\x00") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in trainer did not start")
		}
	}
	total, trainers, n := sampleTree(os.Getpid())
	if n != 2 || trainers <= 0 || total <= trainers {
		t.Fatalf("total %.2f MB, trainers %.2f MB, %d processes; want this process and one trainer", total, trainers, n)
	}
}
