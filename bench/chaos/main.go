// Command chaos is cohort's seeded fault soak: for -duration (and until at
// least -min-faults faults), it trains run after run of the mock plugins
// (4 ranks: `cohort coordinator` and a `cohort worker` per rank, which the
// harness starts and reaps as a launcher would; a checkpoint every epoch)
// to completion, and every 15-30 s injects one fault into the run at hand,
// the kinds taken in a seeded shuffled cycle. The coordinator and each
// rank run on hosts of their own, network namespaces on one bridge
// (bench/internal/netns, which needs root), so a rank's link can be cut.
// The kinds:
//
//   - kill_worker: SIGKILL of a rank's worker (its rank dies; the run goes
//     on with the others; the harness starts its worker again when the
//     run's coordinator is restarted, and the next run starts all four, as
//     an operator or Slurm would);
//   - kill_trainer, kill_averager: SIGKILL of a rank's plugin (the worker
//     replaces it);
//   - stop_worker: SIGSTOP of a worker past the heartbeat timeout, then
//     SIGCONT (the rank is declared dead; its worker, refused by the
//     coordinator, ends within its liveness timeout);
//   - cut_link_short, cut_link_long: a rank's link cut at the bridge (no
//     frame either way), then restored: for 0.5 s, which TCP's
//     retransmissions ride out within the heartbeat timeout, so the rank
//     must live on and lose nothing; and for the heartbeat timeout plus
//     1.5 s, which is a death: the coordinator declares the rank dead and
//     hands its unfinished work to the others, and its worker, hearing
//     nothing past its liveness timeout, ends (started again as after
//     kill_worker). Each outcome is checked;
//   - hostile: bursts of garbage, 4 GiB lengths, stalled handshakes and
//     silent connections at the coordinator's control port, each of which
//     must be dropped;
//   - kill_coordinator: SIGKILL of the coordinator, then at once `cohort
//     coordinator --resume` on the same address and out directory: the
//     workers come back to it with their plugins and models and the run
//     goes on from its last consensus (from its checkpoint when the cohort
//     had lost a rank).
//
// After each run it reads the mock trainer's ledger (a line per sample
// trained) against what the coordinator recorded a fault took: the work a
// dead rank's record lists as taken back (deaths/*.json, Unfinished: what
// it trained since the last round that averaged its work, and the rest of
// its plans), the kept work a coordinator that came back replaced
// (comebacks/*.json, Retrained: only when some rank started fresh), and,
// for a coordinator that resumed from its checkpoint instead, what was
// trained of the work that checkpoint lists as remaining (and of every
// later epoch). Such work is in no surviving model. Every sample of every
// epoch must have a training outside it (samples_missing), and each sample
// trained more than once in an epoch must be such work trained again, or
// the epoch's plan of a killed trainer (twice_allowed, by cause). Whatever
// else is trained twice is twice_unexplained. Nothing may be
// left behind: processes of its binaries or in its namespaces, the runs'
// arenas in /dev/shm, files (the plugins' sockets) in the runs' TMPDIR,
// and, at the end, its namespaces and veths. It prints one JSON line and
// exits non-zero when a check fails. Killed outright, it leaves its
// namespaces (and what runs in them) to its next start, which deletes them.
//
//	go run ./bench/chaos -bin bin               # 10 minutes, seed 1
//	go run ./bench/chaos -bin bin -duration 2m -min-faults 5 -seed 7
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/bench/internal/netns"
)

type harness struct {
	bin, binDir, pluginDir string
	self                   string // this program, which runs the hostile bursts inside the coordinator's host
	bed                    *netns.Bed
	dir                    string
	rng                    *rand.Rand
	epochs                 int
	order                  []int // the current cycle of kinds
	wg                     sync.WaitGroup
	mu                     sync.Mutex
	res                    result
	ctx                    context.Context
}

type result struct {
	Seed             uint64            `json:"seed"`
	Seconds          float64           `json:"seconds"`
	FaultsInjected   int               `json:"faults_injected"`
	Faults           map[string]int    `json:"faults"`
	RunsCompleted    int               `json:"runs_completed"`
	RunsFailed       int               `json:"runs_failed"`
	SamplesMissing   uint64            `json:"samples_missing"`
	SamplesTwice     uint64            `json:"samples_trained_twice"`
	TwiceAllowed     map[string]uint64 `json:"twice_allowed"`
	TwiceUnexplained uint64            `json:"twice_unexplained"`
	LedgerBadLines   int               `json:"ledger_bad_lines"`
	LeftBehind       int               `json:"left_behind"`
	HostileKept      int               `json:"hostile_not_dropped"`
	CoordPeakRSSMB   float64           `json:"coordinator_peak_rss_mb"`
	// Problems says what failed, briefly; empty when every check holds.
	Problems []string `json:"problems"`
}

func main() {
	binDir := flag.String("bin", "bin", "the build: cohort and plugins/ with the mock plugins")
	seed := flag.Uint64("seed", 1, "seed of the faults' times, kinds and victims")
	duration := flag.Duration("duration", 10*time.Minute, "how long to inject faults")
	minFaults := flag.Int("min-faults", 25, "fewest faults to inject, however long it takes")
	epochs := flag.Int("epochs", 40, "epochs per run")
	keep := flag.Bool("keep", false, "keep the work directory (runs' out directories, ledgers)")
	hostileAt := flag.String("hostile-at", "", "(the harness's own use) throw the hostile cases at this address, one line per connection kept, and exit")
	garbage := flag.String("garbage", "", "(with -hostile-at) the wrong-secret bytes, in hex")
	flag.Parse()
	if *hostileAt != "" {
		os.Exit(hostileMain(*hostileAt, *garbage))
	}
	os.Exit(soakMain(*binDir, *seed, *duration, *minFaults, *epochs, *keep))
}

// soakMain is the soak; it returns the exit status once its deferred cleanup
// (the namespaces, the work directory) is done.
func soakMain(binDir string, seed uint64, duration time.Duration, minFaults, epochs int, keep bool) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h, err := newHarness(ctx, binDir, seed, epochs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		return 2
	}
	if !keep {
		defer os.RemoveAll(h.dir)
	} else {
		fmt.Fprintf(os.Stderr, "chaos: work directory %s\n", h.dir)
	}
	veths := rootVeths()
	bed, err := netns.New(nsPrefix, nsSite, ranks+1, "")
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: the hosts' namespaces: %v\n", err)
		return 2
	}
	h.bed = bed
	func() {
		// However the soak ends, the namespaces go before the line is
		// printed and the left-behind count is taken.
		defer bed.Close()
		h.soak(duration, minFaults)
	}()
	if left := bedLeft(bed, veths); len(left) > 0 {
		h.res.LeftBehind += len(left)
		h.problem("left behind at the end: %s", strings.Join(left, "; "))
	}
	res := h.res
	sort.Strings(res.Problems)
	line, err := json.Marshal(res)
	if err != nil {
		panic(err) // plain fields always marshal
	}
	fmt.Println(string(line))
	if len(res.Problems) > 0 {
		return 1
	}
	return 0
}

// The hosts' namespaces: cohort-chaos-<pid>-h0 runs the coordinator and
// cohort-chaos-<pid>-h<r+1> rank r, on 10.76.x.0/24 (a subnet no other bench
// uses).
const (
	nsPrefix = "cohort-chaos-"
	nsSite   = 76
)

// rootVeths counts the veths in this machine's own namespace; the bed
// makes none there, and must leave none.
func rootVeths() int {
	out, _ := exec.Command("ip", "-o", "link", "show", "type", "veth").Output()
	return strings.Count(string(out), "\n")
}

// bedLeft says what of bed is left once it was closed: its namespaces, and
// veths in the machine's namespace beyond the veths there before it.
func bedLeft(bed *netns.Bed, veths int) []string {
	var left []string
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, bed.ID+"-") {
			left = append(left, "namespace "+strings.Fields(line)[0])
		}
	}
	if n := rootVeths(); n > veths {
		left = append(left, fmt.Sprintf("%d veths in the machine's namespace", n-veths))
	}
	return left
}

// newHarness copies the build into a directory of its own, so that the
// left-behind check knows the harness's processes by their binary's path.
func newHarness(ctx context.Context, binDir string, seed uint64, epochs int) (*harness, error) {
	dir, err := os.MkdirTemp("", "cohort-chaos-")
	if err != nil {
		return nil, err
	}
	h := &harness{ctx: ctx, dir: dir, binDir: filepath.Join(dir, "bin"), rng: rand.New(rand.NewPCG(seed, 0x6368616f73)), epochs: epochs,
		res: result{Seed: seed, Faults: map[string]int{}, TwiceAllowed: map[string]uint64{}, Problems: []string{}}}
	if h.self, err = os.Executable(); err != nil {
		return nil, err
	}
	h.bin = filepath.Join(h.binDir, "cohort")
	h.pluginDir = filepath.Join(h.binDir, "plugins")
	if err := os.MkdirAll(h.pluginDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := copyFile(filepath.Join(binDir, "cohort"), h.bin); err != nil {
		return nil, err
	}
	var sums strings.Builder
	for _, p := range []string{"cohort-trainer-mock", "cohort-averaging-mock"} {
		sum, err := copyFile(filepath.Join(binDir, "plugins", p), filepath.Join(h.pluginDir, p))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&sums, "%s  %s\n", sum, p)
	}
	return h, os.WriteFile(filepath.Join(h.pluginDir, "SHA256SUMS"), []byte(sums.String()), 0o644)
}

// copyFile copies an executable and returns its sha256.
func copyFile(from, to string) (string, error) {
	in, err := os.Open(from)
	if err != nil {
		return "", fmt.Errorf("the build (make build): %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	hash := sha256.New()
	if _, err := io.Copy(io.MultiWriter(out, hash), in); err != nil {
		out.Close()
		return "", err
	}
	return hex.EncodeToString(hash.Sum(nil)), out.Close()
}

func (h *harness) problem(format string, a ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintln(os.Stderr, "chaos: "+msg)
	h.res.Problems = append(h.res.Problems, msg)
}

// runTimeout bounds one run, resumes included: a run that hangs is a
// failure, not a stalled soak.
const runTimeout = 5 * time.Minute

// soak runs runs until duration has passed and minFaults faults were
// injected.
func (h *harness) soak(duration time.Duration, minFaults int) {
	start := time.Now()
	nextFault := start.Add(h.interval())
	for i := 0; h.ctx.Err() == nil && (time.Since(start) < duration || h.res.FaultsInjected < minFaults); i++ {
		r, err := h.newRun(i)
		if err == nil {
			err = r.start(false)
		}
		if err != nil {
			h.problem("run %d: %v", i, err)
			break
		}
		nextFault = h.drive(r, nextFault)
		h.finish(i, r)
	}
	h.wg.Wait()
	h.res.Seconds = time.Since(start).Seconds()
}

// interval is the seeded wait before the next fault: 15-30 s.
func (h *harness) interval() time.Duration {
	return 15*time.Second + time.Duration(h.rng.Int64N(int64(15*time.Second)))
}

// drive injects faults into r until it ends, and returns the next fault's
// time.
func (h *harness) drive(r *run, nextFault time.Time) time.Time {
	deadline := time.After(runTimeout)
	for {
		select {
		case <-r.exited:
			return nextFault
		case <-h.ctx.Done():
			r.cmd.Process.Signal(os.Interrupt)
			<-r.exited
			return nextFault
		case <-deadline:
			h.problem("run in %s: still running after %v; killed. Its output, tail:\n%s", r.dir, runTimeout, r.tail())
			r.cmd.Process.Kill()
			<-r.exited
			r.killWorkers()
			return nextFault
		case <-time.After(time.Until(nextFault)):
			p := r.procs()
			if !p.formed() {
				nextFault = time.Now().Add(500 * time.Millisecond)
				continue
			}
			if h.inject(r, p) {
				nextFault = time.Now().Add(h.interval())
			} else {
				nextFault = time.Now().Add(time.Second)
			}
		}
	}
}

// finish checks a run that ended: its exit and summary, what is left of
// it, and its ledger against what its faults took.
func (h *harness) finish(i int, r *run) {
	if !r.waitWorkers(30 * time.Second) {
		h.problem("run %d (%s): workers still running 30 s after the coordinator exited", i, r.dir)
		r.killWorkers()
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		h.res.RunsFailed++
		h.problem("run %d (%s): cohort coordinator exited %d; output, tail:\n%s", i, r.dir, code, r.tail())
	} else if err := r.completed(); err != nil {
		h.res.RunsFailed++
		h.problem("run %d (%s): %v", i, r.dir, err)
	} else {
		h.res.RunsCompleted++
	}
	if left := r.settle(15 * time.Second); len(left) > 0 {
		h.res.LeftBehind += len(left)
		h.problem("run %d left behind: %s", i, strings.Join(left, "; "))
	}
	h.res.CoordPeakRSSMB = max(h.res.CoordPeakRSSMB, float64(r.peakRSSKB)/1024)
	deaths, err := r.deaths()
	if err != nil {
		h.problem("run %d: death records: %v", i, err)
	}
	back, err := r.cameBack()
	if err != nil {
		h.problem("run %d: comeback records: %v", i, err)
	}
	deaths = append(deaths, back...)
	ts, bad, err := readLedger(r.ledger)
	if err != nil {
		h.problem("run %d: %v", i, err)
		return
	}
	h.res.LedgerBadLines += bad
	a := tally(ts, r.epochs, r.samples, append(r.losts, deaths...))
	h.res.SamplesMissing += a.Missing
	h.res.SamplesTwice += a.Twice
	h.res.TwiceUnexplained += a.Unexplained
	for k, v := range a.Allowed {
		h.res.TwiceAllowed[k] += v
	}
	if a.Missing > 0 || a.Unexplained > 0 {
		h.problem("run %d (%s): %d samples missing, %d trained twice beyond what its faults took", i, r.dir, a.Missing, a.Unexplained)
	}
	fmt.Fprintf(os.Stderr, "chaos: run %d: %d epochs, exit %d, %d trained twice (%v), %d faults so far\n",
		i, r.epochs, r.cmd.ProcessState.ExitCode(), a.Twice, a.Allowed, h.res.FaultsInjected)
}
