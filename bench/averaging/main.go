// Command averaging benchmarks cohort's CPU averaging against
// torch.distributed's gloo all-reduce, in the same run and at the same
// sizes: N local ranks, each holding the given megabytes of float32, end
// with the element-wise mean.
//
// cohort's side is the real thing: the reduce server in this process, and
// one cohort-averaging-cpu plugin process per rank (started through
// go-plugin as a rank's core would), each averaging its own /dev/shm arena.
// A round is timed from the moment every rank is asked to average until the
// last returns. gloo's side is peers/gloo_allreduce.py, whose JSON line is
// read. For both, one warm-up round precedes the timed ones and the median
// is reported; the ratio is cohort / gloo (below 1: cohort is faster).
//
// Two kinds of rows, measured in the same run: "same-host" rows average
// -mb per rank through shared memory, with the memory floor beside them (a
// plain parallel copy of the bytes the fold reads and writes: every rank's
// arena read once and written once) and cohort's ratio to it; "cross-host"
// rows average -cross-mb per rank with every rank its own host, so all
// bytes cross the host leaders' ring over loopback TCP.
//
//	go run ./bench/averaging                 # 2 and 4 ranks, 100 MB same-host and 25 MB cross-host, 5 rounds
//	go run ./bench/averaging -ranks 4 -mb 100 -iters 7 -plugin bin/plugins/cohort-averaging-cpu
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cohortdl/cohort/bench/internal/repo"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/core/reduceserver"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

func main() {
	ranksFlag := flag.String("ranks", "2,4", "comma-separated rank counts")
	mb := flag.Float64("mb", 100, "float32 payload per rank of the same-host rows, in MB (1e6 bytes); 0 skips them")
	crossMB := flag.Float64("cross-mb", 25, "float32 payload per rank of the cross-host rows (every rank its own host), in MB; 0 skips them")
	iters := flag.Int("iters", 5, "timed rounds per size (after one warm-up)")
	pluginPath := flag.String("plugin", "", "cohort-averaging-cpu binary (default: build it)")
	// The plain weighted mean is what gloo's all-reduce computes; the
	// default smoothing would add a pass over the parameters to each round.
	settings := flag.String("settings", `{"smoothing": 0}`, "the averager's settings JSON")
	python := flag.String("python", "/usr/bin/python3", "python with torch")
	gloo := flag.String("gloo", "", "gloo peer script (default: ../shared/peers/gloo_allreduce.py beside the repository, or beside the checkout a worktree or clone comes from)")
	noGloo := flag.Bool("no-gloo", false, "skip the gloo peer")
	flag.BoolVar(&verbose, "v", false, "print every rank's round timings")
	netns := flag.Bool("netns", false, "instead, the rows of hosts as network namespaces with shaped links (root): 2 hosts × 2 ranks and 4 × 1, f32 and bf16 wires, against gloo and the link floor")
	netnsMB := flag.Float64("netns-mb", 25, "float32 payload per rank of the -netns rows, in MB")
	netnsRate := flag.String("netns-rate", "1gbit", "each namespace host's link rate, as tc writes it (bits per second)")
	nccl := flag.String("nccl", "", "also time this cohort-averaging-nccl binary on the same-host rows (a GPU host), as a ratio to the CPU plugin's rounds")
	flag.Parse()

	if *netns {
		if err := netnsRows(*netnsMB, *iters, *netnsRate, *pluginPath, *settings, *python, *gloo, *noGloo); err != nil {
			fmt.Fprintln(os.Stderr, "bench/averaging:", err)
			os.Exit(1)
		}
		return
	}

	if err := run(*ranksFlag, *mb, *crossMB, *iters, *pluginPath, *settings, *python, *gloo, *noGloo, *nccl); err != nil {
		fmt.Fprintln(os.Stderr, "bench/averaging:", err)
		os.Exit(1)
	}
}

var verbose bool

type result struct {
	Kind     string  `json:"kind"`
	Ranks    int     `json:"ranks"`
	Bytes    int64   `json:"bytes"`
	CohortS  float64 `json:"cohort_median_s"`
	CohortLo float64 `json:"cohort_min_s"`
	CohortHi float64 `json:"cohort_max_s"`
	GlooS    float64 `json:"gloo_median_s,omitempty"`
	CPUS     float64 `json:"cpu_median_s,omitempty"` // an nccl row's CPU plugin, its ratio's base
	Ratio    float64 `json:"ratio,omitempty"`
	FloorS   float64 `json:"floor_median_s,omitempty"`
	XFloor   float64 `json:"ratio_to_floor,omitempty"`
}

// resolve builds the plugin when pluginPath is empty (cleanup removes it)
// and, unless noGloo, defaults gloo's script to the kit's (repo.GlooPeer).
func resolve(pluginPath, gloo string, noGloo bool) (string, string, func(), error) {
	root, err := repo.Root()
	if err != nil {
		return "", "", nil, err
	}
	cleanup := func() {}
	if pluginPath == "" {
		dir, err := os.MkdirTemp("", "cohort-bench-")
		if err != nil {
			return "", "", nil, err
		}
		cleanup = func() { os.RemoveAll(dir) }
		pluginPath = filepath.Join(dir, "cohort-averaging-cpu")
		cmd := exec.Command("go", "build", "-o", pluginPath, "./plugins/averaging-cpu")
		// As the Makefile builds it: with the vector kernels and GHASH.
		cmd.Env = append(os.Environ(), "GOEXPERIMENT=simd")
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			cleanup()
			return "", "", nil, fmt.Errorf("build the plugin: %w", err)
		}
	}
	if gloo == "" && !noGloo {
		if gloo, err = repo.GlooPeer(root); err != nil {
			cleanup()
			return "", "", nil, err
		}
	}
	return pluginPath, gloo, cleanup, nil
}

func run(ranksFlag string, mb, crossMB float64, iters int, pluginPath, settings, python, gloo string, noGloo bool, nccl string) error {
	pluginPath, gloo, cleanup, err := resolve(pluginPath, gloo, noGloo)
	if err != nil {
		return err
	}
	defer cleanup()
	var sizes []int
	for _, s := range strings.Split(ranksFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad -ranks %q", ranksFlag)
		}
		sizes = append(sizes, n)
	}
	type kind struct {
		name     string
		mb       float64
		settings string
	}
	var kinds []kind
	if mb > 0 {
		kinds = append(kinds, kind{"same-host", mb, settings})
	}
	if crossMB > 0 {
		var m map[string]any
		if err := json.Unmarshal([]byte(settings), &m); err != nil {
			return fmt.Errorf("bad -settings: %w", err)
		}
		if m == nil {
			m = map[string]any{}
		}
		m["host"] = "rank"
		b, _ := json.Marshal(m)
		kinds = append(kinds, kind{"cross-host", crossMB, string(b)})
	}
	fmt.Printf("cohort CPU averaging vs gloo all-reduce, float32, median of %d rounds after a warm-up; plugin %s\n", iters, pluginPath)
	for _, k := range kinds {
		fmt.Printf("%s: %.0f MB per rank, settings %s\n", k.name, k.mb, k.settings)
	}
	fmt.Printf("\n%-10s  %5s  %5s  %10s  %10s  %10s  %10s  %7s  %10s  %7s\n", "rows", "ranks", "MB", "cohort ms", "min ms", "max ms", "gloo ms", "ratio", "floor ms", "×floor")
	var out []result
	for _, k := range kinds {
		elems := int64(k.mb * 1e6 / 4)
		for _, n := range sizes {
			times, err := benchCohort(n, elems, iters, pluginPath, k.settings)
			if err != nil {
				return fmt.Errorf("%s, %d ranks: %w", k.name, n, err)
			}
			sort.Float64s(times)
			r := result{Kind: k.name, Ranks: n, Bytes: elems * 4, CohortS: times[len(times)/2], CohortLo: times[0], CohortHi: times[len(times)-1]}
			glooCol, ratioCol, floorCol, xCol := "-", "-", "-", "-"
			if !noGloo {
				g, err := benchGloo(python, gloo, n, k.mb, iters)
				if err != nil {
					return fmt.Errorf("gloo, %d ranks: %w", n, err)
				}
				r.GlooS, r.Ratio = g, r.CohortS/g
				glooCol, ratioCol = fmt.Sprintf("%.1f", g*1e3), fmt.Sprintf("%.3f", r.Ratio)
			}
			if k.name == "same-host" {
				r.FloorS = memoryFloor(n, elems, iters)
				r.XFloor = r.CohortS / r.FloorS
				floorCol, xCol = fmt.Sprintf("%.1f", r.FloorS*1e3), fmt.Sprintf("%.2f", r.XFloor)
			}
			fmt.Printf("%-10s  %5d  %5.0f  %10.1f  %10.1f  %10.1f  %10s  %7s  %10s  %7s\n", k.name, n, k.mb, r.CohortS*1e3, r.CohortLo*1e3, r.CohortHi*1e3, glooCol, ratioCol, floorCol, xCol)
			out = append(out, r)
			if nccl != "" && k.name == "same-host" {
				// The NCCL plugin on the same arenas: its ratio is to the
				// CPU plugin's row above, not to gloo.
				times, _, err := benchOn(nil, n, elems, iters, nccl, func(int) string { return k.settings })
				if err != nil {
					return fmt.Errorf("nccl, %d ranks: %w", n, err)
				}
				sort.Float64s(times)
				g := result{Kind: "nccl", Ranks: n, Bytes: elems * 4, CohortS: times[len(times)/2], CohortLo: times[0], CohortHi: times[len(times)-1]}
				g.CPUS, g.Ratio = r.CohortS, g.CohortS/r.CohortS
				fmt.Printf("%-10s  %5d  %5.0f  %10.1f  %10.1f  %10.1f  %10s  %7.3f  %10s  %7s   (ratio: to the cpu row)\n", "nccl", n, k.mb, g.CohortS*1e3, g.CohortLo*1e3, g.CohortHi*1e3, "-", g.Ratio, "-", "-")
				out = append(out, g)
			}
		}
	}
	fmt.Println()
	for _, r := range out {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
	return nil
}

// memoryFloor is the median time, over iters passes, of moving the bytes
// a same-host round must at least move: n arenas of elems float32, each
// read once and written once, by n goroutines (one per rank, each taking
// its slice of every arena, as the fold does). Each pass copies arena i+1's
// slice into arena i's, so no byte is read twice from cache.
func memoryFloor(n int, elems int64, iters int) float64 {
	bufs := make([][]float32, n)
	for i := range bufs {
		bufs[i] = make([]float32, elems)
		for k := range bufs[i] {
			bufs[i][k] = 1 // fault the pages in before timing
		}
	}
	var times []float64
	for range iters {
		start := time.Now()
		parallel(n, func(r int) error {
			lo, hi := elems*int64(r)/int64(n), elems*int64(r+1)/int64(n)
			for i := range n {
				copy(bufs[i][lo:hi], bufs[(i+1)%n][lo:hi])
			}
			return nil
		})
		times = append(times, time.Since(start).Seconds())
	}
	sort.Float64s(times)
	return times[len(times)/2]
}

// benchCohort runs iters+1 rounds of n plugin processes on loopback and
// returns the timed rounds' wall times in seconds.
func benchCohort(n int, elems int64, iters int, pluginPath, settings string) ([]float64, error) {
	times, _, err := benchOn(nil, n, elems, iters, pluginPath, func(int) string { return settings })
	return times, err
}

// benchOn runs iters+1 rounds of n plugin processes, on bed's hosts (nil:
// loopback), rank r with settings(r), and returns the timed rounds' wall
// times in seconds and the most bytes one rank moved in a timed round.
func benchOn(bed *nsBed, n int, elems int64, iters int, pluginPath string, settings func(r int) string) ([]float64, uint64, error) {
	ctx := context.Background()
	layout, err := arena.Pack([]arena.Entry{{Name: "params", DType: arena.F32, Shape: []int64{elems}, Role: arena.Parameter}})
	if err != nil {
		return nil, 0, err
	}
	key := make([]byte, 32)
	rand.Read(key)
	runID := fmt.Sprintf("bench-%d-%d", os.Getpid(), n)
	logger := hclog.New(&hclog.LoggerOptions{Name: "bench", Level: hclog.Warn, Output: os.Stderr})
	cfg := reduceserver.Config{Addr: "127.0.0.1:0", Key: key, RunID: runID, World: uint32(n), Layout: &layout, Logger: logger}
	var srv *reduceserver.Server
	if bed != nil {
		srv, err = bed.listen(ctx, cfg)
	} else {
		srv, err = reduceserver.Listen(ctx, cfg)
	}
	if err != nil {
		return nil, 0, err
	}
	defer srv.Close()

	// The relay the NCCL plugin meets through (the CPU plugin meets at
	// the reduce server and ignores it).
	relays := plugintest.NewRelayGroup(uint32(n))
	arenas := make([]*arena.Owned, n)
	clients := make([]*goplugin.Client, n)
	avgs := make([]plugin.Averager, n)
	defer func() {
		for i := range avgs {
			if avgs[i] != nil {
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				avgs[i].Shutdown(sctx)
				cancel()
			}
			if clients[i] != nil {
				plugin.Kill(clients[i])
			}
			if arenas[i] != nil {
				arenas[i].Remove()
			}
		}
	}()
	for r := 0; r < n; r++ {
		if arenas[r], err = arena.Create("", fmt.Sprintf("cohort-bench-r%d", r), layout); err != nil {
			return nil, 0, err
		}
		cmd := exec.Command(pluginPath)
		if bed != nil {
			cmd = bed.command(r, pluginPath)
		}
		clients[r] = goplugin.NewClient(plugin.ClientConfig(plugin.ClientOptions{Cmd: cmd, Logger: logger}))
		if avgs[r], err = plugin.DispenseAverager(clients[r]); err != nil {
			return nil, 0, err
		}
	}
	if err := parallel(n, func(r int) error {
		_, err := avgs[r].Configure(ctx, plugin.AveragerConfig{
			Rank: uint32(r), WorldSize: uint32(n), Arena: arenas[r].Descriptor(), Endpoint: srv.Addr(),
			DataKey: key, Settings: json.RawMessage(settings(r)), RunID: runID, Relay: relays.Relay(uint32(r)),
		})
		return err
	}); err != nil {
		return nil, 0, fmt.Errorf("configure: %w", err)
	}
	var times []float64
	var moved uint64
	for round := 0; round <= iters; round++ {
		for r, a := range arenas {
			f, _ := a.Float32s(0)
			v := float32(r + 1)
			for i := range f {
				f[i] = v
			}
		}
		start := time.Now()
		res := make([]plugin.RoundResult, n)
		if err := parallel(n, func(r int) error {
			var err error
			res[r], err = avgs[r].Average(ctx, plugin.Round{Round: uint64(round), Steps: 1})
			return err
		}); err != nil {
			return nil, 0, fmt.Errorf("round %d: %w", round, err)
		}
		d := time.Since(start).Seconds()
		want := float32(n+1) / 2
		for r, a := range arenas {
			f, _ := a.Float32s(0)
			if math.Abs(float64(f[0]-want)) > 1e-4 || math.Abs(float64(f[len(f)-1]-want)) > 1e-4 {
				return nil, 0, fmt.Errorf("round %d: rank %d holds %v, want %v", round, r, f[0], want)
			}
		}
		if round > 0 {
			times = append(times, d)
			for _, x := range res {
				moved = max(moved, x.BytesMoved)
			}
		}
		if verbose {
			for r, x := range res {
				fmt.Fprintf(os.Stderr, "  round %d rank %d: total %.1f ms, reduce %.1f ms, wait %.1f ms, %d bytes over the data channel\n", round, r, x.TotalMS, x.ReduceMS, x.WaitMS, x.BytesMoved)
			}
		}
	}
	return times, moved, nil
}

func parallel(n int, f func(int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func benchGloo(python, script string, n int, mb float64, iters int) (float64, error) {
	cmd := exec.Command(python, script, "--ranks", strconv.Itoa(n), "--mb", strconv.FormatFloat(mb, 'f', -1, 64), "--iters", strconv.Itoa(iters))
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		var r struct {
			Peer    string  `json:"peer"`
			MedianS float64 `json:"median_s"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Peer == "gloo" {
			return r.MedianS, nil
		}
	}
	return 0, fmt.Errorf("no JSON result line from %s: %q", script, stdout.String())
}
