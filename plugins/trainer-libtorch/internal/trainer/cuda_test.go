package trainer

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// TestCUDA trains on a GPU what the CPU tests train on the host: the shim
// built against a CUDA libtorch (LIBTORCH=/path) on a host with a device. A
// CUDA model's tensors cannot be views into the host arena; TestCopyMode's
// "cuda" case checks Publish and Adopt copying device ↔ arena. Skipped,
// with the reason, where the shim's libtorch sees no device.
func TestCUDA(t *testing.T) {
	if tr := newTestTrainer(t); tr.shim.CUDADevices == 0 {
		t.Skip("this libtorch sees no CUDA device (build the shim against a CUDA libtorch on a GPU host)")
	}
	data := synthData(t, 512, 8, 3)
	cuda := func(kv map[string]any) map[string]any {
		return merge(data, map[string]any{"device": "cuda", "threads": 1}, kv)
	}

	t.Run("models-train", func(t *testing.T) {
		for _, c := range []struct {
			name string
			kv   map[string]any
		}{
			{"mlp-sgd", map[string]any{"hidden": []int{16}}},
			{"mlp-adamw", map[string]any{"hidden": []int{16}, "optimizer": "adamw", "lr": 0.01}},
			{"torchscript-adam", map[string]any{"model": filepath.Join(scriptModels(t), "net.pt"), "optimizer": "adam", "lr": 0.01}},
		} {
			t.Run(c.name, func(t *testing.T) {
				tr := newTestTrainer(t)
				setup := configure(t, tr, cuda(c.kv))
				if _, zc := attach(t, tr, setup); zc {
					t.Fatal("a CUDA model reported zero-copy views into the host arena")
				}
				before := evaluate(t, tr)
				var losses []float64
				for e := range uint64(6) {
					losses = append(losses, trainPlan(t, tr, fullPlan(e, setup.Samples)))
				}
				after := evaluate(t, tr)
				t.Logf("epoch losses %.4f; eval loss %.4f -> %.4f, accuracy %.3f", losses, before.Loss, after.Loss, *after.Accuracy)
				if !(losses[len(losses)-1] < losses[0]/2) || !(after.Loss < before.Loss/2) || *after.Accuracy < 0.85 {
					t.Fatalf("did not learn on the GPU: epochs %v, eval %v -> %v, accuracy %v", losses, before.Loss, after.Loss, *after.Accuracy)
				}
			})
		}
	})

	// A checkpoint taken on the GPU restores bitwise into a fresh trainer.
	// Bitwise continuation after the restore needs deterministic kernels;
	// what must hold regardless is that the restored parameters are the
	// saved ones and that training goes on from them.
	t.Run("checkpoint", func(t *testing.T) {
		kv := cuda(map[string]any{"hidden": []int{16}, "optimizer": "adamw"})
		tr := newTestTrainer(t)
		setup := configure(t, tr, kv)
		d, _ := attach(t, tr, setup)
		m := openMapping(t, d)
		trainPlan(t, tr, fullPlan(0, setup.Samples))
		dir := filepath.Join(t.TempDir(), "ckpt")
		if _, err := tr.SaveCheckpoint(context.Background(), dir); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
		saved := slices.Clone(m.Bytes())
		trainPlan(t, tr, fullPlan(1, setup.Samples))
		if _, err := tr.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
		continued := slices.Clone(m.Bytes())

		tr2 := newTestTrainer(t)
		d2, _ := attach(t, tr2, configure(t, tr2, kv))
		m2 := openMapping(t, d2)
		if _, err := tr2.LoadCheckpoint(context.Background(), dir, plugin.LoadResume); err != nil {
			t.Fatal(err)
		}
		if _, err := tr2.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m2.Bytes(), saved) {
			t.Fatal("the restored parameters differ from the saved ones")
		}
		trainPlan(t, tr2, fullPlan(1, setup.Samples))
		if _, err := tr2.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(m2.Bytes(), continued) {
			t.Log("training after the restore matches training on, bit for bit")
		} else {
			a, b := arena.AsFloat32s(m2.Bytes()), arena.AsFloat32s(continued)
			var worst float64
			for i := range a {
				worst = max(worst, math.Abs(float64(a[i]-b[i])))
			}
			t.Logf("training after the restore differs from training on by at most %g (non-deterministic kernels)", worst)
			if worst > 1e-3 {
				t.Fatalf("training after the restore diverged by %g: optimizer state not restored", worst)
			}
		}
	})
}
