// Command scale measures one coordinator against many ranks: for each
// size it starts a coordinator in a child process (this binary again, under
// $COHORT_SCALE_COORDINATOR) and that many simulated ranks in this process,
// each speaking the real control protocol over loopback (rank.go: a
// worker's conversation with a trainer that sleeps per batch and an
// averager whose rounds succeed at once). The run trains -epochs epochs
// under the sync policy with a round every -sync-every batches; after
// -kill-after rounds it kills -kill-pct percent of the ranks (at least two),
// half by closing their connection abruptly, half by falling silent
// (heartbeats too) on an open one, which only the heartbeat timeout
// catches.
//
// It prints one JSON line per size: formation time (first dial to the last
// rank's SetEpochCallbackRole), round times (a round's first Sync to its
// first Update, as the ranks saw them), each death's detection (its kill to
// the first DeclareDead for it), the coordinator loop's handling time per
// Heartbeat (Options.LoopTimer, in the child), and the child's peak RSS and
// CPU time (its rusage). goal_misses lists the goals a size missed: every
// death detected within the heartbeat timeout + 1 s, heartbeat p99 under
// 1 ms, RSS under 300 MB, formation under 10 s. It exits non-zero only when
// a run failed, never for a missed goal.
//
//	go run ./bench/scale                                # 10, 100 and 1000 ranks
//	go run ./bench/scale -sizes 1000 -profile /tmp/prof  # then go tool pprof -top /tmp/prof/coordinator-1000.cpu.pprof
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// options are the harness's flags.
type options struct {
	sizes     []int
	epochs    int
	syncEvery int
	windows   int // windows per epoch, which sets the data set's size
	batch     int
	batchTime time.Duration
	heartbeat time.Duration
	hbTimeout time.Duration
	killPct   float64
	killAfter int
	timeout   time.Duration
	profile   string
}

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	o := options{}
	sizes := flag.String("sizes", "10,100,1000", "rank counts, comma-separated")
	flag.IntVar(&o.epochs, "epochs", 3, "epochs per run")
	flag.IntVar(&o.syncEvery, "sync-every", 2, "batches between rounds")
	flag.IntVar(&o.windows, "windows", 3, "windows (rounds) per epoch")
	flag.IntVar(&o.batch, "batch", 4, "samples per batch")
	flag.DurationVar(&o.batchTime, "batch-time", 200*time.Millisecond, "how long each simulated batch trains")
	flag.DurationVar(&o.heartbeat, "heartbeat", time.Second, "the ranks' Heartbeat cadence")
	flag.DurationVar(&o.hbTimeout, "heartbeat-timeout", 3*time.Second, "the coordinator's heartbeat timeout (liveness)")
	flag.Float64Var(&o.killPct, "kill-pct", 1, "percent of the ranks killed (at least two)")
	flag.IntVar(&o.killAfter, "kill-after", 3, "completed rounds before the kills")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "limit on each size's run")
	flag.StringVar(&o.profile, "profile", "", "directory for the coordinator's CPU and allocation profiles, one pair per size")
	flag.Parse()
	for f := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			fmt.Fprintf(os.Stderr, "scale: -sizes: %q is not a rank count of at least 2\n", f)
			os.Exit(2)
		}
		o.sizes = append(o.sizes, n)
	}
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
	}
	failed := false
	for _, n := range o.sizes {
		res, err := runSize(context.Background(), o, n)
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale: %d ranks: %v\n", n, err)
			failed = true
			continue
		}
		line, err := json.Marshal(res)
		if err != nil {
			fmt.Fprintf(os.Stderr, "scale: %d ranks: encode the result: %v\n", n, err)
			failed = true
			continue
		}
		fmt.Println(string(line))
	}
	if failed {
		os.Exit(1)
	}
}

// result is one size's JSON line.
type result struct {
	Ranks            int      `json:"ranks"`
	Status           string   `json:"status"`
	RunS             float64  `json:"run_s"`
	FormationS       float64  `json:"formation_s"`
	Rounds           int      `json:"rounds"`
	RoundP50MS       float64  `json:"round_p50_ms"`
	RoundP99MS       float64  `json:"round_p99_ms"`
	LivenessTimeoutS float64  `json:"liveness_timeout_s"`
	Deaths           int      `json:"deaths"`
	DeathDetectMaxS  float64  `json:"death_detect_max_s"`
	CloseDetectMaxS  float64  `json:"death_detect_close_max_s"`
	SilentDetectMaxS float64  `json:"death_detect_silent_max_s"`
	Heartbeats       int      `json:"heartbeats"`
	HeartbeatP50MS   float64  `json:"heartbeat_p50_ms"`
	HeartbeatP99MS   float64  `json:"heartbeat_p99_ms"`
	HeartbeatMaxMS   float64  `json:"heartbeat_max_ms"`
	BatchMeanMS      float64  `json:"batch_mean_ms"`
	CoordinatorRSSMB float64  `json:"coordinator_peak_rss_mb"`
	CoordinatorCPUS  float64  `json:"coordinator_cpu_s"`
	GoalMisses       []string `json:"goal_misses"`
	// Loop is the coordinator loop's cost by what woke it.
	Loop map[string]*eventStat `json:"loop"`
}

// goals checks the result against the goals at this size.
func (r *result) goals(undetected int) {
	miss := func(format string, args ...any) { r.GoalMisses = append(r.GoalMisses, fmt.Sprintf(format, args...)) }
	if undetected > 0 {
		miss("%d of %d deaths never detected", undetected, r.Deaths)
	}
	if r.DeathDetectMaxS > r.LivenessTimeoutS+1 {
		miss("a death took %.2fs to detect, over the liveness timeout + 1 s", r.DeathDetectMaxS)
	}
	if r.HeartbeatP99MS >= 1 {
		miss("heartbeat p99 %.3f ms, not under 1 ms", r.HeartbeatP99MS)
	}
	if r.CoordinatorRSSMB >= 300 {
		miss("coordinator peak RSS %.0f MB, not under 300 MB", r.CoordinatorRSSMB)
	}
	if r.FormationS >= 10 {
		miss("formation took %.1fs, not under 10 s", r.FormationS)
	}
	if r.GoalMisses == nil {
		r.GoalMisses = []string{}
	}
}
