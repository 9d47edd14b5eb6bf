package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// nodeSecret is the run secret of the node tests' processes.
const nodeSecret = envSecret + "=node-test-secret-0123456789abcdef"

// startCoordinator starts `cohort coordinator` for ranks ranks on a free
// loopback port and returns it, its address and where its logs go.
func startCoordinator(t *testing.T, cfg, out string, ranks int) (*exec.Cmd, string, *lockedWriter) {
	t.Helper()
	bin := cohortBinary(t)
	coord := exec.Command(bin, "coordinator", "--config", cfg, "--listen", "127.0.0.1:0", "--ranks", strconv.Itoa(ranks), "--out", out)
	coord.Env = append(os.Environ(), nodeSecret, envSecretFile+"=")
	stdout, err := coord.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedWriter{w: &strings.Builder{}}
	coord.Stderr = logs
	if err := coord.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { coord.Process.Kill(); coord.Wait() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatal("the coordinator printed nothing")
	}
	var addr string
	if _, err := fmt.Sscanf(sc.Text(), "coordinator listening on %s", &addr); err != nil {
		t.Fatalf("first line %q: %v", sc.Text(), err)
	}
	go io.Copy(io.Discard, stdout)
	return coord, addr, logs
}

// waitExit waits for cmd, failing the test past timeout.
func waitExit(t *testing.T, cmd *exec.Cmd, what string, timeout time.Duration, logs fmt.Stringer) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(timeout):
		cmd.Process.Kill()
		t.Fatalf("%s did not finish within %v\n%s", what, timeout, logs)
		return nil
	}
}

// freePort is a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// The documented torchrun recipe, with Debian's torchrun (python3-torch):
// two torchrun agents meet at their own rendezvous, each starts one
// `cohort node` (--nproc_per_node 1), which takes its host index and
// count from torchrun's variables and its coordinator's address from
// --coordinator alone; a mock run of 2 ranks completes.
func TestTorchrunRecipe(t *testing.T) {
	bin := cohortBinary(t)
	torchrun, err := exec.LookPath("torchrun")
	if err != nil {
		t.Fatalf("no torchrun (Debian's python3-torch ships it; make deps installs it): %v", err)
	}
	out := filepath.Join(t.TempDir(), "run")
	cfg := writeRunConfig(t, "run {\n  epochs = 2\n}", map[string]any{"samples": 512})
	coord, addr, logs := startCoordinator(t, cfg, out, 2)
	rdzv := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var agents []*exec.Cmd
	for range 2 {
		// torchrun 1.13 spells its options with underscores; under
		// Python 3.11 it fails to start its workers unless -r and -t
		// name stdout alone (1: "0" parses to nothing there).
		a := exec.Command(torchrun, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv,
			"--rdzv_id", "cohort-test", "--max_restarts", "0", "-r", "1", "-t", "1", "--log_dir", t.TempDir(), "--no_python",
			bin, "node", "--coordinator", addr, "--ranks-per-node", "1", "--config", cfg)
		a.Env = append(os.Environ(), nodeSecret, envSecretFile+"=")
		a.Stdout, a.Stderr = logs, logs
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Process.Kill(); a.Wait() })
		agents = append(agents, a)
	}
	if err := waitExit(t, coord, "the coordinator", 120*time.Second, logs); err != nil {
		t.Fatalf("coordinator: %v\n%s", err, logs)
	}
	for i, a := range agents {
		if err := waitExit(t, a, "torchrun", 60*time.Second, logs); err != nil {
			t.Errorf("torchrun agent %d: %v\n%s", i, err, logs)
		}
	}
	sum := readSummary(t, out)
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != 2 || len(sum.Ranks) != 2 {
		t.Fatalf("summary: status %s, %d epochs, %d ranks\n%s", sum.Status, len(sum.Epochs), len(sum.Ranks), logs)
	}
	for _, r := range sum.Ranks {
		if r.State != record.RankExited || r.Samples == 0 {
			t.Errorf("rank %d: %s after %d samples, want exited having trained", r.Rank, r.State, r.Samples)
		}
	}
}

// A rank SIGKILLed under `cohort node` takes none of its siblings with
// it: the coordinator re-forms the cohort on the survivors, the run
// completes, and the node exits 0 having reported the death.
func TestNodeSurvivesAKilledRank(t *testing.T) {
	bin := cohortBinary(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := writeRunConfig(t, "run {\n  epochs = 2\n}\ncoordinator {\n  heartbeat_timeout = \"2s\"\n  sync_every = 4\n}",
		map[string]any{"samples": 2048, "batch_size": 16, "sleep_per_batch": "10ms"})
	coord, addr, logs := startCoordinator(t, cfg, out, 3)
	node := exec.Command(bin, "node", "--coordinator", addr, "--nodes", "1", "--ranks-per-node", "3", "--config", cfg)
	node.Env = append(os.Environ(), nodeSecret, envSecretFile+"=")
	node.Stdout, node.Stderr = logs, logs
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Process.Kill(); node.Wait() })
	// Rank 1 dies once the run trains: its summary counts batches.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if s, err := record.ReadSummary(filepath.Join(out, record.SummaryFile)); err == nil && len(s.Epochs) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no epoch finished within a minute\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(workerPID(t, node.Process.Pid, 1), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, coord, "the coordinator", 90*time.Second, logs); err != nil {
		t.Fatalf("coordinator: %v\n%s", err, logs)
	}
	if err := waitExit(t, node, "the node", 60*time.Second, logs); err != nil {
		t.Fatalf("node: %v, want exit 0\n%s", err, logs)
	}
	sum := readSummary(t, out)
	if sum.Status != record.StatusCompleted || len(sum.Epochs) != 2 {
		t.Fatalf("status %s, %d epochs; want completed with 2\n%s", sum.Status, len(sum.Epochs), logs)
	}
	for r, want := range []string{record.RankExited, record.RankDead, record.RankExited} {
		if got := sum.Ranks[r].State; got != want {
			t.Errorf("rank %d %s, want %s", r, got, want)
		}
	}
	if !strings.Contains(logs.String(), "rank ended before the run did; the others go on: rank=1") {
		t.Errorf("the node did not report rank 1's death:\n%s", logs)
	}
}
