package trainer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/plugintest"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/shared/plugin"
)

// buildPlugin builds the plugin binary into a temporary directory.
func buildPlugin(t *testing.T) string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	bin := filepath.Join(t.TempDir(), "cohort-trainer-libtorch")
	if out, err := exec.Command(goBin, "build", "-o", bin, "../..").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// envWithout is the environment minus the named variable.
func envWithout(name string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// TestPluginProcess runs the real binary through go-plugin, with the shim
// found next to it, and drives a short run over gRPC.
func TestPluginProcess(t *testing.T) {
	needTorch(t)
	bin := buildPlugin(t)
	if err := os.Symlink(os.Getenv(shim.Env), filepath.Join(filepath.Dir(bin), shim.File)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = envWithout(shim.Env)
	var logs plugintest.LogBuffer
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: &logs, Level: hclog.Debug})
	client := goplugin.NewClient(plugin.ClientConfig(plugin.ClientOptions{Cmd: cmd, Logger: logger, StartTimeout: time.Minute}))
	defer client.Kill()
	tr, err := plugin.DispenseTrainer(client)
	if err != nil {
		t.Fatalf("%v\nplugin log:\n%s", err, logs.String())
	}
	ctx := context.Background()
	desc, err := tr.Describe(ctx)
	if err != nil || desc.Name != "libtorch" {
		t.Fatalf("%+v %v", desc, err)
	}
	setup, err := tr.Configure(ctx, plugin.TrainerConfig{
		WorldSize: 2, Rank: 1, LocalRanks: 2, Seed: 3,
		Settings: settingsJSON(t, merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}})),
	})
	if err != nil {
		t.Fatal(err)
	}
	d := newArena(t, setup.Layout)
	zc, err := tr.Attach(ctx, d)
	if err != nil || !zc {
		t.Fatalf("Attach: %v %v", zc, err)
	}
	var reports int
	if err := tr.Train(ctx, plugin.Plan{Epoch: 0, Seed: 1, PickSpace: 256, PartitionOffset: 128, PartitionSize: 128}, func(r plugin.BatchReport) error {
		reports++
		return nil
	}); err != nil || reports != 2 {
		t.Fatalf("Train: %d reports, %v", reports, err)
	}
	pub, err := tr.Publish(ctx)
	if err != nil || pub.Steps != 2 || pub.ParamNorm <= 0 {
		t.Fatalf("Publish %+v %v", pub, err)
	}
	ev, err := tr.Evaluate(ctx)
	if err != nil || ev.Accuracy == nil || ev.Samples != 128 {
		t.Fatalf("Evaluate %+v %v", ev, err)
	}
	// The model, the optimizer, the trainer's state and the TorchScript
	// export.
	files, err := tr.SaveCheckpoint(ctx, t.TempDir())
	if err != nil || len(files) != 4 {
		t.Fatalf("SaveCheckpoint %v %v", files, err)
	}
	if _, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, Settings: []byte(`{"optimiser": "sgd"}`)}); err == nil || !strings.Contains(err.Error(), "unknown key \"optimiser\"") {
		t.Fatalf("a bad setting over gRPC: %v", err)
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "configured") {
		t.Errorf("the plugin's log did not reach the host:\n%s", logs.String())
	}
}

// TestPluginMissingShim: without a shim the binary exits with an error that
// names every path it tried.
func TestPluginMissingShim(t *testing.T) {
	bin := buildPlugin(t)
	hs := plugin.Handshake()
	missing := filepath.Join(t.TempDir(), "libcohort_torch_shim.so")
	cmd := exec.Command(bin)
	cmd.Env = append(envWithout(shim.Env), shim.Env+"="+missing, hs.MagicCookieKey+"="+hs.MagicCookieValue)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		t.Fatal("the plugin started without a shim")
	}
	if !strings.Contains(stderr.String(), missing+" (no such file)") || !strings.Contains(stderr.String(), "cannot load the libtorch shim") {
		t.Fatalf("stderr does not name the missing shim:\n%s", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Fatalf("the plugin wrote to stdout: %q", stdout.String())
	}
}

// TestRanksShareOneCopy: the trainers of a host's ranks, each in its own
// process, map one read-only copy of the data (one memfd), and each
// trains and evaluates from it.
func TestRanksShareOneCopy(t *testing.T) {
	needTorch(t)
	bin := buildPlugin(t)
	data := settingsJSON(t, merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}}))
	const ranks = 3
	ctx := context.Background()
	files := map[string][]int{} // the memfd each process maps -> pids
	for rank := range ranks {
		cmd := exec.Command(bin)
		var logs plugintest.LogBuffer
		logger := hclog.New(&hclog.LoggerOptions{Name: "host", Output: &logs, Level: hclog.Debug})
		client := goplugin.NewClient(plugin.ClientConfig(plugin.ClientOptions{Cmd: cmd, Logger: logger, StartTimeout: time.Minute}))
		defer client.Kill()
		tr, err := plugin.DispenseTrainer(client)
		if err != nil {
			t.Fatalf("%v\nplugin log:\n%s", err, logs.String())
		}
		setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: ranks, Rank: uint32(rank), LocalRanks: ranks, Seed: 3, Settings: data})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Attach(ctx, newArena(t, setup.Layout)); err != nil {
			t.Fatal(err)
		}
		if err := tr.Train(ctx, plugin.Plan{Seed: 1, PickSpace: 256, PartitionOffset: uint64(rank) * 64, PartitionSize: 64}, func(plugin.BatchReport) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if ev, err := tr.Evaluate(ctx); err != nil || ev.Samples != 128 {
			t.Fatalf("rank %d: Evaluate %+v %v", rank, ev, err)
		}
		pid := client.ReattachConfig().Pid
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		var mine []string
		for _, line := range strings.Split(string(maps), "\n") {
			if f := strings.Fields(line); len(f) >= 6 && strings.Contains(f[5], "memfd:cohort-hostshare") {
				if !strings.HasPrefix(f[1], "r--s") {
					t.Errorf("rank %d maps the data as %q", rank, line)
				}
				mine = append(mine, f[3]+" "+f[4])
			}
		}
		if len(mine) != 1 {
			t.Fatalf("rank %d maps %d copies of the data: %v", rank, len(mine), mine)
		}
		files[mine[0]] = append(files[mine[0]], pid)
	}
	if len(files) != 1 {
		t.Fatalf("the ranks map %d copies of the data, want one: %v", len(files), files)
	}
}
