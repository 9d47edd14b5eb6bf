package trainer

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/dataset"
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/plugin"
)

// BenchmarkEpochMLP measures one epoch of the default MLP on Fashion-MNIST
// (784-256-10, SGD 0.05 momentum 0.9, batch 64, 60000 samples) through the
// plugin's Trainer in-process (Go data gather + the C ABI + libtorch), and
// the same epoch as a plain C++ libtorch loop (bench/ref_epoch.cpp), both at
// the plugin's default thread count (cores / 1 local rank;
// COHORT_BENCH_THREADS=N sets another). It reports both and their ratio, the
// cost of the plugin boundary (medians of the epochs; the reference runs
// as many epochs as the plugin did, after it):
//
//	go test -run=NONE -bench=EpochMLP -benchtime=5x ./plugins/trainer-libtorch/internal/trainer/
func BenchmarkEpochMLP(b *testing.B) {
	needTorch(b)
	if _, err := os.Stat(DefaultData); err != nil {
		b.Fatalf("Fashion-MNIST is not at %s: install dataset-fashion-mnist", DefaultData)
	}
	tr := newTestTrainer(b)
	kv := map[string]any{}
	if th := os.Getenv("COHORT_BENCH_THREADS"); th != "" {
		var n int
		if _, err := fmt.Sscan(th, &n); err != nil {
			b.Fatalf("COHORT_BENCH_THREADS=%q: %v", th, err)
		}
		kv["threads"] = n
	}
	setup := configure(b, tr, kv)
	attach(b, tr, setup)
	noop := func(plugin.BatchReport) error { return nil }
	ctx := context.Background()
	// Warm-up: 50 batches.
	if err := tr.Train(ctx, plugin.Plan{Epoch: 999, Seed: 1, PickSpace: setup.Samples, PartitionSize: 50 * 64}, noop); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	epochs := make([]float64, b.N)
	for i := range b.N {
		start := time.Now()
		if err := tr.Train(ctx, fullPlan(uint64(i), setup.Samples), noop); err != nil {
			b.Fatal(err)
		}
		epochs[i] = float64(time.Since(start)) / float64(time.Millisecond)
	}
	b.StopTimer()
	slices.Sort(epochs)
	pluginMS := epochs[len(epochs)/2]

	ref, err := runReference(b, tr, b.N)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(pluginMS, "plugin-ms/epoch")
	b.ReportMetric(ref, "libtorch-ms/epoch")
	b.ReportMetric(pluginMS/ref, "plugin/libtorch")
	b.ReportMetric(float64(tr.threads), "threads")
}

// runReference builds and runs the C++ loop on the trainer's data and
// returns its median epoch time in milliseconds.
func runReference(b *testing.B, tr *Trainer, epochs int) (float64, error) {
	refBin, err := filepath.Abs(filepath.Join("..", "..", "build", "cohort-torch-ref-epoch"))
	if err != nil {
		return 0, err
	}
	if out, err := exec.Command("make", "--no-print-directory", "-f", "../../shim.mk", "REF_OUT="+refBin, "ref").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("make ref: %v\n%s", err, out)
	}
	d := tr.train
	dir := b.TempDir()
	labels := make([]byte, d.N())
	for i, l := range d.Labels() {
		labels[i] = byte(l)
	}
	// The trainer widened its copy of the pixels to floats at load: the
	// reference reads the bytes from the file.
	pixels, err := dataset.IDXTrainImages(DefaultData)
	if err != nil {
		return 0, err
	}
	if len(pixels) != d.N()*d.Features() {
		return 0, fmt.Errorf("%s holds %d bytes, the trainer %d samples of %d", DefaultData, len(pixels), d.N(), d.Features())
	}
	img, lab := filepath.Join(dir, "images.u8"), filepath.Join(dir, "labels.u8")
	if err := os.WriteFile(img, pixels, 0o600); err != nil {
		return 0, err
	}
	if err := os.WriteFile(lab, labels, 0o600); err != nil {
		return 0, err
	}
	cmd := exec.Command(refBin, img, lab, fmt.Sprint(d.N()), fmt.Sprint(d.Features()), fmt.Sprint(epochs),
		fmt.Sprint(tr.threads), fmt.Sprint(tr.s.BatchSize))
	// The threading settings the shim made for this process reach the
	// reference through the environment; its malloc settings go the same way.
	cmd.Env = append(os.Environ(), shim.MallocEnv(os.Environ())...)
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s: %v", refBin, err)
	}
	var res struct {
		MS []float64 `json:"ms_per_epoch"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.MS) == 0 {
		return 0, fmt.Errorf("reference output %q: %v", out, err)
	}
	slices.Sort(res.MS)
	return res.MS[len(res.MS)/2], nil
}

// BenchmarkPublishAdopt measures a round's trainer side for the default
// MLP (203,530 f32 parameters, zero-copy): Publish (norm + the copy kept
// for a blending Adopt), then Adopt without and with blending.
func BenchmarkPublishAdopt(b *testing.B) {
	needTorch(b)
	tr := newTestTrainer(b)
	dir := b.TempDir()
	x := make([]float32, 64*784)
	y := make([]int64, 64)
	for i := range y {
		y[i] = int64(i % 10)
	}
	writeNPY(b, filepath.Join(dir, "x.npy"), "<f4", []int{64, 784}, f32Bytes(x))
	writeNPY(b, filepath.Join(dir, "y.npy"), "<i8", []int{64}, i64Bytes(y))
	setup := configure(b, tr, map[string]any{"data_x": filepath.Join(dir, "x.npy"), "data_y": filepath.Join(dir, "y.npy")})
	attach(b, tr, setup)
	ctx := context.Background()
	for _, alpha := range []float64{0, 0.5} {
		b.Run(fmt.Sprintf("alpha=%v", alpha), func(b *testing.B) {
			for range b.N {
				if _, err := tr.Publish(ctx); err != nil {
					b.Fatal(err)
				}
				if _, err := tr.Adopt(ctx, alpha); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
