package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/core/reduceserver"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// TestPluginProcesses builds cohort-averaging-cpu and averages through real
// plugin processes started as a rank's core starts them: on one host
// (shared memory) and with every rank its own host (TCP).
func TestPluginProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	bin := buildPlugin(t)
	for _, host := range []string{"", "rank"} {
		t.Run("host="+host, func(t *testing.T) { runProcesses(t, bin, host) })
	}
}

func runProcesses(t *testing.T, bin, host string) {
	const world = 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	layout, err := arena.Pack([]arena.Entry{
		{Name: "w", DType: arena.F32, Shape: []int64{1000, 10}, Role: arena.Parameter},
		{Name: "running_mean", DType: arena.F32, Shape: []int64{10}, Role: arena.Buffer},
	})
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("a 32-byte data key for the tests")
	logger := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Warn, Output: os.Stderr})
	srv, err := reduceserver.Listen(ctx, reduceserver.Config{Addr: "127.0.0.1:0", Key: key, RunID: "proc", World: world, Layout: &layout, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	maps := make([]*arena.Mapping, world)
	avgs := make([]plugin.Averager, world)
	for r := 0; r < world; r++ {
		path := filepath.Join(dir, fmt.Sprintf("r%d.arena", r))
		if err := os.WriteFile(path, make([]byte, layout.Size), 0o600); err != nil {
			t.Fatal(err)
		}
		if maps[r], err = arena.Open(arena.Descriptor{Path: path, Layout: layout}); err != nil {
			t.Fatal(err)
		}
		defer maps[r].Close()
		for i := range layout.Entries {
			f, _ := maps[r].Float32s(i)
			for k := range f {
				f[k] = float32(r * (k%7 + 1))
			}
		}
		c := goplugin.NewClient(plugin.ClientConfig(plugin.ClientOptions{Cmd: exec.Command(bin), Logger: logger}))
		defer c.Kill()
		if avgs[r], err = plugin.DispenseAverager(c); err != nil {
			t.Fatal(err)
		}
	}
	settings, _ := json.Marshal(map[string]any{"host": host})
	run := func(f func(r int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, world)
		for r := 0; r < world; r++ {
			wg.Add(1)
			go func() { defer wg.Done(); errs[r] = f(r) }()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	run(func(r int) error {
		_, err := avgs[r].Configure(ctx, plugin.AveragerConfig{Rank: uint32(r), WorldSize: world, Arena: maps[r].Descriptor(),
			Endpoint: srv.Addr(), DataKey: key, Settings: settings, RunID: "proc"})
		return err
	})
	steps := []uint64{1, 0, 3} // rank 1 idle
	run(func(r int) error {
		res, err := avgs[r].Average(ctx, plugin.Round{Round: 1, Steps: steps[r]})
		if err == nil && !res.Realized {
			err = fmt.Errorf("not realized")
		}
		return err
	})
	for r := 0; r < world; r++ {
		w, _ := maps[r].Float32s(0)
		b, _ := maps[r].Float32s(1)
		for k := range w {
			// (0·1 + 2·3·x) / 4 with x = k%7+1.
			if want := float32(6*(k%7+1)) / 4; w[k] != want {
				t.Fatalf("rank %d w[%d] = %v, want %v", r, k, w[k], want)
			}
		}
		for k := range b {
			if want := float32(2*(k%7+1)) / 2; b[k] != want { // movers 0 and 2
				t.Fatalf("rank %d buffer[%d] = %v, want %v", r, k, b[k], want)
			}
		}
	}
	run(func(r int) error { return avgs[r].Shutdown(ctx) })
}

// buildPlugin builds cohort-averaging-cpu into a directory of t's.
func buildPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cohort-averaging-cpu")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// TestConformanceBinary runs the conformance suite on the plugin binary,
// each cohort meeting at a reduce server of its own.
func TestConformanceBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	key := []byte("a 32-byte data key for the tests")
	meet := func(t conformance.T, world uint32, layout arena.Layout) conformance.Meeting {
		srv, err := reduceserver.Listen(context.Background(), reduceserver.Config{
			Addr: "127.0.0.1:0", Key: key, RunID: "conformance", World: world, Layout: &layout, Timeout: 5 * time.Second,
		})
		if err != nil {
			t.Fatalf("reduce server: %v", err)
		}
		t.Cleanup(func() { srv.Close() })
		return conformance.Meeting{Endpoint: srv.Addr(), DataKey: key, RunID: "conformance", MarkDead: srv.MarkDead}
	}
	conformance.RunAverager(t, conformance.AveragerBinary(buildPlugin(t)),
		conformance.MeetingPoint(meet),
		conformance.Settings([]byte(`{"smoothing": 0, "timeout": "5s"}`)),
		conformance.Gamma(2, []byte(`{"gamma": 2, "smoothing": 0, "timeout": "5s"}`)),
		conformance.Stateful([]byte(`{"outer": "slowmo", "timeout": "5s"}`)))
}
