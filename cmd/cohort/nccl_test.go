package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// On a host without NCCL, `cohort run --averaging nccl` ends within
// seconds with the averager's error, naming the library and every place
// it was looked for, not after the formation timeout.
func TestRunNCCLWithoutLibraries(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA driver: the run may well find NCCL")
	}
	buildPlugin(t, "averaging-nccl")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cohortBinary(t), "run", "--trainer", "mock", "--averaging", "nccl", "--ranks", "2", "--epochs", "1")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), envSecret+"=", envSecretFile+"=", "COHORT_NCCL_LIBRARY=", "LD_LIBRARY_PATH=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("cohort run succeeded without NCCL:\n%s", out)
	}
	if took > 15*time.Second {
		t.Errorf("cohort run took %v to fail; want the averager's error within seconds", took)
	}
	for _, want := range []string{"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "nvidia/*/lib/libnccl.so.2", "COHORT_NCCL_LIBRARY"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the output does not name %q:\n%s", want, tail(string(out), 6000))
		}
	}
}
