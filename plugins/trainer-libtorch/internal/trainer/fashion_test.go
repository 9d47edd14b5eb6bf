package trainer

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestFashionMNISTAccuracy trains the default MLP (784-256-10, SGD 0.05,
// momentum 0.9, batch 64) on Fashion-MNIST for 3 epochs in one process and
// wants at least 85% test accuracy. About 10-30 s:
//
//	go test -run TestFashionMNISTAccuracy -v ./plugins/trainer-libtorch/internal/trainer/
func TestFashionMNISTAccuracy(t *testing.T) {
	needTorch(t)
	if _, err := os.Stat(DefaultData); err != nil {
		t.Fatalf("Fashion-MNIST is not at %s (%v): install dataset-fashion-mnist", DefaultData, err)
	}
	tr := newTestTrainer(t)
	start := time.Now()
	// The reference hyper-parameters (peers/ddp_fashion_mnist.py) with a
	// cosine schedule over the 3 epochs: at a constant lr of 0.05 a single
	// process (this plugin and the Python peer alike) ends near 84%.
	setup := configure(t, tr, map[string]any{
		"model": "mlp", "hidden": []int{256}, "batch_size": 64,
		"optimizer": "sgd", "lr": 0.05, "momentum": 0.9,
		"lr_schedule": "cosine", "lr_total_steps": 3 * 938,
	})
	t.Logf("configure (data load, model) %v", time.Since(start).Round(time.Millisecond))
	if setup.Samples != 60000 || setup.EvalSamples != 10000 || setup.BatchSize != 64 {
		t.Fatalf("setup %+v", setup)
	}
	attach(t, tr, setup)
	var acc float64
	for epoch := uint64(0); epoch < 3; epoch++ {
		es := time.Now()
		loss := trainPlan(t, tr, fullPlan(epoch, setup.Samples))
		ev, err := tr.Evaluate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		acc = *ev.Accuracy
		t.Logf("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.4f (%v)", epoch, loss, ev.Loss, acc, time.Since(es).Round(time.Millisecond))
	}
	if acc < 0.85 {
		t.Fatalf("test accuracy %.4f after 3 epochs, want at least 0.85", acc)
	}
}
