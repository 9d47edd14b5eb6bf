package trainer

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pythonTorch is Debian's python3-torch, which loads an exported model as a
// user would.
const pythonTorch = "/usr/bin/python3"

// Every checkpoint holds model.pt, a TorchScript module PyTorch loads on its
// own; on the Fashion-MNIST test split it scores what the trainer's own
// evaluation says, within 0.1 point: the exported forward computes the
// trained model's. The MLP, 200 batches in; the CNN's export is the same
// code with other layers, left out for time (it passes, 30 s more here).
func TestExportedModelLoadsInPyTorch(t *testing.T) {
	needTorch(t)
	if _, err := os.Stat(DefaultData); err != nil {
		t.Skipf("Fashion-MNIST is not at %s: %v", DefaultData, err)
	}
	if err := exec.Command(pythonTorch, "-c", "import torch").Run(); err != nil {
		t.Skipf("no PyTorch for %s (apt-get install python3-torch): %v", pythonTorch, err)
	}
	cases := []struct {
		settings map[string]any
		samples  uint64
	}{
		{map[string]any{"model": "mlp", "hidden": []int{64}, "batch_size": 64, "lr": 0.05, "momentum": 0.9}, 200 * 64},
	}
	var models []string
	var want []float64
	for _, tc := range cases {
		tr := newTestTrainer(t)
		setup := configure(t, tr, tc.settings)
		attach(t, tr, setup)
		plan := fullPlan(0, setup.Samples)
		plan.PartitionSize = tc.samples
		trainPlan(t, tr, plan)
		ev, err := tr.Evaluate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		files, err := tr.SaveCheckpoint(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		model := filepath.Join(dir, ExportedModel)
		if !containsPath(files, model) {
			t.Errorf("SaveCheckpoint lists %v, not %s", files, model)
		}
		models = append(models, model)
		want = append(want, 100**ev.Accuracy)
	}
	args := append([]string{"../../testdata/eval_exported.py", DefaultData}, models...)
	out, err := exec.Command(pythonTorch, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("python3 eval_exported.py: %v\n%s", err, out)
	}
	got := strings.Fields(string(out))
	if len(got) != len(want) {
		t.Fatalf("python printed %q, want %d accuracies", out, len(want))
	}
	for i, g := range got {
		acc, err := strconv.ParseFloat(g, 64)
		if err != nil || math.Abs(acc-want[i]) > 0.1 {
			t.Errorf("%v: PyTorch scores the exported model %s%%, the trainer %.2f%%", cases[i].settings["model"], g, want[i])
		}
	}
}

func containsPath(files []string, p string) bool {
	for _, f := range files {
		if f == p {
			return true
		}
	}
	return false
}
