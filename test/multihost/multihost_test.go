// Package multihost is cohort's multi-host test bed on one machine: each
// "host" is a network namespace (with its own hostname, and its own
// /dev/shm, so ranks of different hosts share nothing but the network),
// joined to the others through veth pairs on a bridge in a switch
// namespace. The coordinator runs in host 0 and two ranks in each of hosts
// 1 and 2. `make multihost` runs it as root and prints one JSON line per
// case; without COHORT_MULTIHOST=1 the test skips (it needs root, iproute2
// and util-linux's unshare).
//
// Every namespace is named after this test process (cohort-mh<pid>-*), and
// removed when the test ends, whatever happened; namespaces of a test
// process that died without cleaning up are removed at the next start.
package multihost

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

var cohortBin = flag.String("cohort", "", "the cohort binary, with its plugins in plugins/ beside it")

const prefix = "cohort-mh"

// bed is one test bed: a switch namespace and hosts on 10.77.<net>.0/24.
type bed struct {
	t     *testing.T
	id    string
	hosts []string // namespace names; host i has address addr(i)
	net   int
}

func (b *bed) addr(i int) string { return fmt.Sprintf("10.77.%d.%d", b.net, 10+i) }

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// removeStale deletes namespaces left by test processes that are gone.
func removeStale(t *testing.T) {
	out, _ := exec.Command("ip", "netns", "list").Output()
	re := regexp.MustCompile(`^` + prefix + `(\d+)-\S+`)
	for _, line := range strings.Split(string(out), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if syscall.Kill(pid, 0) == nil {
			continue // its test is still running
		}
		name := strings.Fields(m[0])[0]
		t.Logf("removing namespace %s left by process %d", name, pid)
		exec.Command("ip", "netns", "del", name).Run()
	}
}

func newBed(t *testing.T, hosts int) *bed {
	t.Helper()
	removeStale(t)
	b := &bed{t: t, id: fmt.Sprintf("%s%d", prefix, os.Getpid()), net: 100 + os.Getpid()%100}
	sw := b.id + "-sw"
	t.Cleanup(func() {
		for _, ns := range append([]string{sw}, b.hosts...) {
			// Killing what still runs in a namespace lets it go.
			if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
				for _, p := range strings.Fields(string(pids)) {
					if n, err := strconv.Atoi(p); err == nil {
						syscall.Kill(n, syscall.SIGKILL)
					}
				}
			}
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	run(t, "ip", "netns", "add", sw)
	run(t, "ip", "-n", sw, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", sw, "link", "set", "br0", "up")
	for i := range hosts {
		ns := fmt.Sprintf("%s-h%d", b.id, i)
		b.hosts = append(b.hosts, ns)
		run(t, "ip", "netns", "add", ns)
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		// The veth's two ends are made in the host namespace and one moved
		// into the switch, so no interface ever appears in the machine's own.
		run(t, "ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", fmt.Sprintf("p%d", i), "netns", sw)
		run(t, "ip", "-n", sw, "link", "set", fmt.Sprintf("p%d", i), "master", "br0", "up")
		run(t, "ip", "-n", ns, "addr", "add", b.addr(i)+"/24", "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	}
	return b
}

// proc is a shell running in host i's namespaces; its processes are its
// process group.
type proc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

// start runs script in host i: its own network, hostname and /dev/shm.
func (b *bed) start(i int, env []string, script string) *proc {
	b.t.Helper()
	full := fmt.Sprintf("mount -t tmpfs -o size=1g tmpfs /dev/shm && hostname %s-h%d && %s", prefix, i, script)
	cmd := exec.Command("ip", "netns", "exec", b.hosts[i], "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", full)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	b.t.Cleanup(func() { p.kill(); <-p.done })
	return p
}

func (p *proc) kill() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }

func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		p.kill()
		<-p.done
		t.Fatalf("still running after %v; output:\n%s", d, p.out.String())
		return -1
	}
}

// caseResult is the JSON line a case prints.
type caseResult struct {
	Case     string   `json:"case"`
	OK       bool     `json:"ok"`
	Status   string   `json:"status"`
	Ranks    int      `json:"ranks"`
	Hosts    int      `json:"hosts"`
	Epochs   int      `json:"epochs"`
	Samples  []uint64 `json:"samples_per_epoch"`
	Accuracy *float64 `json:"final_accuracy,omitempty"`
	Deaths   int      `json:"deaths"`
	Rounds   uint64   `json:"rounds"`
	WallS    float64  `json:"wall_s"`
}

// cohortRun runs one run: the coordinator in host 0, ranks 2h-2 and 2h-1
// in host h for h = 1, 2. during, when set, runs while the run does.
func cohortRun(t *testing.T, name, cfg string, timeout time.Duration, during func(b *bed, workers []*proc)) (*record.Summary, caseResult) {
	if *cohortBin == "" {
		t.Fatal("no -cohort binary")
	}
	b := newBed(t, 3)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cohort.hcl")
	secret := filepath.Join(dir, "secret")
	out := filepath.Join(dir, "out")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("multihost-test-secret-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"COHORT_SECRET_FILE=" + secret}
	coordAddr := b.addr(0) + ":7000"
	start := time.Now()
	coord := b.start(0, env, fmt.Sprintf("exec %s coordinator --config %s --listen %s --ranks 4 --out %s", *cohortBin, cfgPath, coordAddr, out))
	var workers []*proc
	for h := 1; h <= 2; h++ {
		script := ""
		for _, r := range []int{2*h - 2, 2*h - 1} {
			script += fmt.Sprintf("%s worker --config %s --coordinator %s --rank %d --world 4 --local-ranks 2 & ", *cohortBin, cfgPath, coordAddr, r)
		}
		workers = append(workers, b.start(h, env, script+"wait"))
	}
	if during != nil {
		during(b, workers)
	}
	code := coord.wait(t, timeout)
	for _, w := range workers {
		w.wait(t, 30*time.Second)
	}
	sum, err := record.ReadSummary(filepath.Join(out, record.SummaryFile))
	if err != nil {
		t.Fatalf("coordinator exit %d, no summary: %v\n%s", code, err, coord.out.String())
	}
	res := caseResult{Case: name, Status: sum.Status, Ranks: sum.WorldSize, Hosts: 2, Epochs: len(sum.Epochs),
		Deaths: len(sum.MembershipEvents), Rounds: sum.Averaging.Rounds, WallS: time.Since(start).Seconds()}
	for _, e := range sum.Epochs {
		res.Samples = append(res.Samples, e.Samples)
		res.Accuracy = e.Accuracy
	}
	if code != 0 {
		t.Logf("coordinator exit %d:\n%s", code, coord.out.String())
	}
	return sum, res
}

func report(t *testing.T, r caseResult) {
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
	if !r.OK {
		t.Errorf("case %s failed: %s", r.Case, line)
	}
}

func TestMultiHost(t *testing.T) {
	if os.Getenv("COHORT_MULTIHOST") != "1" {
		t.Skip("the multi-host test bed runs under `make multihost` (root; COHORT_MULTIHOST=1)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the multi-host test bed needs root (network namespaces)")
	}
	mockCfg := func(extra string) string {
		return `coordinator {
  sync_every        = 4
  heartbeat_timeout = "3s"
}
trainer "mock" {
  samples    = 1024
  batch_size = 16
` + extra + `
}
averager "mock" {}
`
	}

	t.Run("mock", func(t *testing.T) {
		sum, r := cohortRun(t, "mock", mockCfg(""), 60*time.Second, nil)
		r.OK = sum.Status == record.StatusCompleted && r.Deaths == 0 && r.Rounds > 0 && allEqual(r.Samples, 1024)
		report(t, r)
	})

	t.Run("libtorch+cpu", func(t *testing.T) {
		data := "/usr/share/datasets/fashion-mnist"
		if _, err := os.Stat(data); err != nil {
			t.Fatalf("no Fashion-MNIST at %s (make deps installs it): %v", data, err)
		}
		cfg := `coordinator {
  sync_every = 10
}
trainer "libtorch" {
  model   = "mlp"
  threads = 1
}
averager "cpu" {}
`
		sum, r := cohortRun(t, "libtorch+cpu", cfg, 300*time.Second, nil)
		r.OK = sum.Status == record.StatusCompleted && r.Accuracy != nil && *r.Accuracy >= 0.84 && sum.Averaging.BytesPerRound > 0
		report(t, r)
	})

	t.Run("host-killed", func(t *testing.T) {
		// Slow batches, so host 2 dies mid-run; its two ranks are dead to
		// the coordinator within the heartbeat timeout (or at once, as
		// their links break) and the survivors finish every sample.
		sum, r := cohortRun(t, "host-killed", "run {\n  epochs = 4\n}\n"+mockCfg(`  sleep_per_batch = "60ms"`), 120*time.Second, func(b *bed, workers []*proc) {
			time.Sleep(2 * time.Second)
			workers[1].kill()
		})
		r.OK = sum.Status == record.StatusCompleted && r.Deaths == 2 && allEqual(r.Samples, 1024)
		report(t, r)
	})
}

func allEqual(v []uint64, want uint64) bool {
	if len(v) == 0 {
		return false
	}
	for _, x := range v {
		if x != want {
			return false
		}
	}
	return true
}
