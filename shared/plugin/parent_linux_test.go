package plugin

import (
	"os/exec"
	"testing"
	"time"
)

// parentExit's wait returns once the process exits, and not before.
func TestParentExit(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to watch: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	wait, ok := parentExit(cmd.Process.Pid)
	if !ok {
		t.Skip("no pollable pidfd on this kernel")
	}
	done := make(chan error, 1)
	go func() { done <- wait() }()
	select {
	case err := <-done:
		t.Fatalf("the wait returned while the process runs: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the process's exit went unnoticed")
	}
}
