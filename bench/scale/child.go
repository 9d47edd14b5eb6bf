package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/shared/plugin"
)

// childEnv makes this binary the coordinator child: its value is the
// childParams as JSON. The coordinator runs in a process of its own so that
// its RSS and CPU time are its own, not the simulated ranks'.
const childEnv = "COHORT_SCALE_COORDINATOR"

// childParams is the run the child coordinates.
type childParams struct {
	Ranks            int           `json:"ranks"`
	Epochs           int           `json:"epochs"`
	SyncEvery        int           `json:"sync_every"`
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout"`
	SecretFile       string        `json:"secret_file"`
	Out              string        `json:"out"`
	CPUProfile       string        `json:"cpu_profile,omitempty"`
	HeapProfile      string        `json:"heap_profile,omitempty"`
}

// childReport is the child's last stdout line.
type childReport struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// Heartbeat is the loop's handling time of the ranks' Heartbeat
	// frames.
	Heartbeat timeStat `json:"heartbeat"`
	// Events is the loop's cost by what woke it.
	Events map[string]*eventStat `json:"events"`
}

type timeStat struct {
	Count int     `json:"count"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// eventStat is the loop's cost for one kind of event.
type eventStat struct {
	Count  int     `json:"count"`
	MeanMS float64 `json:"mean_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// listenPrefix starts the child's first stdout line, before the address.
const listenPrefix = "listening on "

// runChild coordinates one run and reports; it returns the exit status.
func runChild(spec string) int {
	if err := coordinate(spec); err != nil {
		fmt.Fprintln(os.Stderr, "scale coordinator:", err)
		return 1
	}
	return 0
}

func coordinate(spec string) error {
	var p childParams
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		return fmt.Errorf("parameters %q: %w", spec, err)
	}
	cfg := config.Default()
	cfg.Run.Ranks = p.Ranks
	cfg.Run.Epochs = p.Epochs
	cfg.Run.Out = p.Out
	cfg.Coordinator.Listen = "127.0.0.1:0"
	cfg.Coordinator.HeartbeatTimeout = p.HeartbeatTimeout
	cfg.Coordinator.FormationTimeout = time.Minute
	cfg.Coordinator.Policy = config.PolicySync
	cfg.Coordinator.SyncEvery = p.SyncEvery
	cfg.Coordinator.MinRanks = 1
	cfg.Coordinator.CheckpointEvery = 0
	secret, err := os.ReadFile(p.SecretFile)
	if err != nil {
		return fmt.Errorf("read the run secret: %w", err)
	}
	keys, err := wire.DeriveKeys(bytes.TrimSpace(secret))
	if err != nil {
		return err
	}

	rep := &childReport{Events: map[string]*eventStat{}}
	var heartbeats []float64
	timer := func(what string, d time.Duration) {
		ms := plugin.Milliseconds(d)
		if what == "Heartbeat" {
			heartbeats = append(heartbeats, ms)
		}
		st := rep.Events[what]
		if st == nil {
			st = &eventStat{}
			rep.Events[what] = st
		}
		st.Count++
		st.MeanMS += ms // a sum until the run ends
		st.MaxMS = max(st.MaxMS, ms)
	}
	coord, err := coordinator.New(coordinator.Options{
		Config:    cfg,
		Keys:      keys,
		Logger:    hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn}),
		LoopTimer: timer,
	})
	if err != nil {
		return err
	}
	fmt.Printf("%s%s\n", listenPrefix, coord.Addr())

	if p.CPUProfile != "" {
		f, err := os.Create(p.CPUProfile)
		if err != nil {
			coord.Close()
			return fmt.Errorf("create the CPU profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			coord.Close()
			return fmt.Errorf("start the CPU profile: %w", err)
		}
	}
	sum, runErr := coord.Run(context.Background())
	pprof.StopCPUProfile()
	if p.HeapProfile != "" {
		if err := writeHeap(p.HeapProfile); err != nil {
			return err
		}
	}
	rep.Status = sum.Status
	if runErr != nil {
		rep.Error = runErr.Error()
	}
	for _, st := range rep.Events {
		st.MeanMS /= float64(st.Count)
	}
	rep.Heartbeat = timeStat{Count: len(heartbeats), P50MS: quantile(heartbeats, 0.5), P99MS: quantile(heartbeats, 0.99),
		MaxMS: quantile(heartbeats, 1)}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create the heap profile: %w", err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("write the heap profile %s: %w", path, err)
	}
	return nil
}
