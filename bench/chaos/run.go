package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/internal/testutil/proctab"
	"github.com/cohortdl/cohort/shared/plugin"
)

// run is one logical run of cohort: an out directory, a config and a
// ledger, trained by one `cohort coordinator` and a `cohort worker` per
// rank, which the harness starts as a launcher would; after each kill of
// the coordinator, one `cohort coordinator --resume` on the same address,
// which the workers that are still there come back to.
type run struct {
	h                *harness
	dir, out, cfg    string
	ledger, tmp      string
	control          string // the coordinator's control address
	epochs, samples  uint64
	seed             uint64
	cmd              *exec.Cmd // the coordinator
	exited           chan struct{}
	workers          map[uint32]*workerProc // the rank workers started and not yet reaped
	mu               sync.Mutex
	runIDs           []string
	losts            []lost
	pluginKills      map[uint32]int // per rank, this run
	incarnationStart int64          // ledger offset where the current coordinator began
	comebacks        []int64        // the ledger's size at each kill a coordinator came back from
	peakRSSKB        int64
	output           strings.Builder // the last coordinator's stdout and stderr
}

// Settings of every run: 4 ranks of the mock plugins, checkpoints every
// epoch, deaths noticed within 2 s, a worker that waits 3 s for a silent
// coordinator, a replaced plugin up to 3 times a rank.
const (
	ranks            = 4
	heartbeatTimeout = 2 * time.Second
	livenessTimeout  = 3 * time.Second
)

// basePort is run 0's control port on the coordinator's host; run i
// listens on basePort+i, so no run meets a port an earlier one left in
// TIME_WAIT. The host is the harness's own: no other program binds there.
const basePort = 21000

func (h *harness) newRun(i int) (*run, error) {
	dir := filepath.Join(h.dir, fmt.Sprintf("run-%03d", i))
	r := &run{h: h, dir: dir, out: filepath.Join(dir, "out"), cfg: filepath.Join(dir, "cohort.hcl"),
		ledger: filepath.Join(dir, "ledger"), tmp: filepath.Join(dir, "tmp"),
		epochs: uint64(h.epochs), samples: 2048, seed: h.rng.Uint64N(1 << 30), pluginKills: map[uint32]int{}, workers: map[uint32]*workerProc{}}
	if err := os.MkdirAll(r.tmp, 0o755); err != nil {
		return nil, err
	}
	r.control = h.bed.Addr(0) + ":" + strconv.Itoa(basePort+i)
	cfg := fmt.Sprintf(`run {
  ranks  = %d
  epochs = %d
  seed   = %d
}
coordinator {
  listen            = %q
  http              = ""
  heartbeat_timeout = %q
  checkpoint_every  = 1
  min_ranks         = 1
  sync_every        = 4
}
worker {
  liveness_timeout = %q
  plugin_dir       = %q
  plugin_lock      = ""
  plugin_restarts  = 3
  shutdown_grace   = "2s"
}
trainer "mock" {
  samples         = %d
  batch_size      = 16
  sleep_per_batch = "15ms"
  ledger          = %q
}
averager "mock" {
}
`, ranks, r.epochs, r.seed, r.control, heartbeatTimeout.String(), livenessTimeout.String(), h.pluginDir, r.samples, r.ledger)
	return r, os.WriteFile(r.cfg, []byte(cfg), 0o644)
}

// start runs `cohort coordinator` on r in the coordinator's host, resuming
// it when resume is set, and a worker for each rank that has none. Its processes put their
// temporary files (the plugins' sockets) in r.tmp, where the end of the
// run looks for any left.
func (r *run) start(resume bool) error {
	args := []string{"coordinator", "--config", r.cfg, "--listen", r.control, "--out", r.out}
	if resume {
		args = append(args, "--resume", r.out)
	}
	r.incarnationStart = fileSize(r.ledger)
	cmd := r.h.bed.Command(0, r.h.bin, args...) // ip netns exec: the process becomes the coordinator
	cmd.Env = r.env()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		return fmt.Errorf("starting cohort coordinator: %w", err)
	}
	pw.Close()
	r.cmd, r.exited = cmd, make(chan struct{})
	r.mu.Lock()
	r.output.Reset()
	r.mu.Unlock()
	go func() {
		defer close(r.exited)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			r.mu.Lock()
			r.output.WriteString(line + "\n")
			if _, id, ok := strings.Cut(line, " (run "); ok && strings.HasPrefix(line, "coordinator listening on ") {
				r.runIDs = append(r.runIDs, strings.TrimSuffix(strings.Fields(id)[0], ","))
			}
			r.mu.Unlock()
		}
		pr.Close()
		cmd.Wait()
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			r.mu.Lock()
			r.peakRSSKB = max(r.peakRSSKB, ru.Maxrss)
			r.mu.Unlock()
		}
	}()
	return r.startWorkers()
}

func (r *run) tail() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.output.String()
	return s[max(0, len(s)-2000):]
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// procs are the run's processes as /proc shows them now.
type procs struct {
	workers   map[uint32]int // rank -> pid
	trainers  map[uint32]int
	averagers map[uint32]int
}

func (r *run) procs() procs {
	p := procs{workers: map[uint32]int{}, trainers: map[uint32]int{}, averagers: map[uint32]int{}}
	ps := proctab.List()
	for rank, w := range r.workers {
		if w.gone() {
			continue
		}
		p.workers[rank] = w.cmd.Process.Pid
		for _, c := range ps {
			if c.PPID != w.cmd.Process.Pid || c.Zombie() || len(c.Args) == 0 {
				continue
			}
			switch base := filepath.Base(c.Args[0]); {
			case strings.HasPrefix(base, "cohort-trainer-"):
				p.trainers[rank] = c.PID
			case strings.HasPrefix(base, "cohort-averaging-"):
				p.averagers[rank] = c.PID
			}
		}
	}
	return p
}

// formed reports whether every live rank runs both plugins, so a fault
// meets a run at work rather than one still starting.
func (p procs) formed() bool {
	if len(p.workers) == 0 {
		return false
	}
	for rank := range p.workers {
		if p.trainers[rank] == 0 || p.averagers[rank] == 0 {
			return false
		}
	}
	return true
}

// lastEpochOf is the epoch of rank's last training written before off.
func lastEpochOf(ledger string, rank uint32, off int64) (uint64, bool) {
	ts, _, err := readLedger(ledger)
	if err != nil {
		return 0, false
	}
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].off < off && ts[i].rank == rank {
			return ts[i].epoch, true
		}
	}
	return 0, false
}

// killed notes a coordinator kill the next coordinator cannot come back
// from: the checkpoint it resumes from says what it trains again, whoever
// trained it before the kill (the workers load that checkpoint).
func (r *run) killed() error {
	dir, err := checkpoint.LastCheckpoint(filepath.Join(r.out, checkpoint.CheckpointsDir))
	if err != nil {
		return err
	}
	m, err := checkpoint.ReadMeta(dir)
	if err != nil {
		return err
	}
	to := fileSize(r.ledger)
	again := map[uint64]bool{}
	perm := plugin.Permutation(uint64(m.Seed), m.Epoch, m.PickSpace)
	for _, rr := range m.Remaining {
		addRanges(again, perm, rr.Ranges, r.samples)
	}
	addRanges(again, perm, m.Pool, r.samples)
	r.losts = append(r.losts, lost{cause: "coordinator_restart", epoch: m.Epoch, anyRank: true, gone: true, samples: again, from: 0, to: to})
	for e := m.Epoch + 1; e < r.epochs; e++ {
		r.losts = append(r.losts, lost{cause: "coordinator_restart", epoch: e, anyRank: true, gone: true, from: 0, to: to})
	}
	return nil
}

// cameBack reads the records of the coordinators that came back: the kept
// work a first round replaced (a broadcast, when some rank started fresh)
// is in no surviving model and is trained again. The k-th record, by
// round, answers the k-th kill noted in r.comebacks; the rank's trainings
// written before that kill are the ones replaced.
func (r *run) cameBack() ([]lost, error) {
	files, _ := filepath.Glob(filepath.Join(r.out, record.ComebacksDir, "*.json"))
	sort.Strings(files)
	var out []lost
	for k, f := range files {
		var c record.ComebackRecord
		if err := record.ReadJSON(f, "comeback record", &c); err != nil {
			return nil, err
		}
		to := int64(1 << 62)
		if k < len(r.comebacks) {
			to = r.comebacks[k]
		}
		for rank, spans := range c.Retrained {
			for _, s := range spans {
				again := map[uint64]bool{}
				addRanges(again, plugin.Permutation(r.seed, s.Epoch, r.samples), []dispatch.Range{s.Range}, r.samples)
				out = append(out, lost{cause: "coordinator_restart", epoch: s.Epoch, rank: rank, gone: true, samples: again, from: 0, to: to})
			}
		}
	}
	return out, nil
}

func addRanges(set map[uint64]bool, perm []uint64, rs []dispatch.Range, samples uint64) {
	for _, rg := range rs {
		for p := rg.Offset; p < rg.Offset+rg.Size && p < uint64(len(perm)); p++ {
			set[perm[p]%samples] = true
		}
	}
}

// deaths reads the run's death records: the work the coordinator took
// back from a dead rank (Unfinished: what it trained since the last round
// that averaged its work, and the unreported rest of its plans) is in no
// surviving model, and is handed out again.
func (r *run) deaths() ([]lost, error) {
	files, _ := filepath.Glob(filepath.Join(r.out, record.DeathsDir, "*.json"))
	var out []lost
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var d record.DeathRecord
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if d.Epoch == 0 {
			continue // before training began
		}
		epoch := d.Epoch - 1
		again := map[uint64]bool{}
		addRanges(again, plugin.Permutation(r.seed, epoch, r.samples), d.Unfinished, r.samples)
		out = append(out, lost{cause: "rank_death", epoch: epoch, rank: d.Rank, gone: true, samples: again, from: 0, to: 1 << 62})
	}
	return out, nil
}

// settle waits up to within for the run's processes to be gone and then
// says what is left: processes of the harness's binaries, processes in
// its hosts' namespaces, arenas of the run's ids in /dev/shm, files in the
// run's TMPDIR (the plugins' sockets).
func (r *run) settle(within time.Duration) (left []string) {
	deadline := time.Now().Add(within)
	for {
		left = r.leftBehind()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leftProcesses lists the live processes running one of the harness's
// binaries.
func (r *run) leftProcesses() []string {
	var left []string
	for _, p := range proctab.List() {
		if !p.Zombie() && len(p.Args) > 0 && strings.HasPrefix(p.Args[0], r.h.binDir+"/") {
			left = append(left, fmt.Sprintf("process %d: %s", p.PID, strings.Join(p.Args, " ")))
		}
	}
	return left
}

// leftInHosts lists the processes still in the hosts' namespaces, but for
// the harness's own hostile bursts, which may outlast a run.
func (r *run) leftInHosts() []string {
	var left []string
	for _, ns := range r.h.bed.Hosts {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			left = append(left, fmt.Sprintf("namespace %s unreadable: %v", ns, err))
			continue
		}
		for _, pid := range strings.Fields(string(out)) {
			if exe, _ := os.Readlink("/proc/" + pid + "/exe"); exe == r.h.self {
				continue
			}
			left = append(left, fmt.Sprintf("process %s in namespace %s", pid, ns))
		}
	}
	return left
}

func (r *run) leftBehind() []string {
	left := append(r.leftProcesses(), r.leftInHosts()...)
	r.mu.Lock()
	ids := append([]string(nil), r.runIDs...)
	r.mu.Unlock()
	for _, id := range ids {
		m, _ := filepath.Glob(filepath.Join("/dev/shm", "cohort-"+id+"-*"))
		for _, a := range m {
			left = append(left, "arena "+a)
		}
	}
	ents, _ := os.ReadDir(r.tmp)
	for _, e := range ents {
		left = append(left, "file "+filepath.Join(r.tmp, e.Name()))
	}
	return left
}

// completed checks the run's summary: completed, every epoch counted in
// full.
func (r *run) completed() error {
	s, err := record.ReadSummary(filepath.Join(r.out, record.SummaryFile))
	if err != nil {
		return err
	}
	if s.Status != record.StatusCompleted || uint64(len(s.Epochs)) != r.epochs {
		return fmt.Errorf("summary: status %s with %d epochs, want completed with %d", s.Status, len(s.Epochs), r.epochs)
	}
	for _, e := range s.Epochs {
		if e.Samples != r.samples {
			return fmt.Errorf("summary: epoch %d counts %d samples, want %d", e.Epoch, e.Samples, r.samples)
		}
	}
	return nil
}
