package trainer

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"golang.org/x/sys/unix"
)

var (
	scriptOnce sync.Once
	scriptDir  string
)

// scriptModels makes TorchScript modules with torch in python3() (runPython)
// (torch.jit.script(...).save()), once per test binary:
//
//	net.pt   8 -> Linear 16 -> BatchNorm1d -> ReLU -> Linear 3 (buffers too)
//	two.pt   8 -> 2 classes: does not fit 3-class labels
//	wide.pt  expects 10 features
//	net64.pt net.pt without BatchNorm, in float64
func scriptModels(t *testing.T) string {
	t.Helper()
	scriptOnce.Do(func() {
		dir, err := os.MkdirTemp("", "cohort-libtorch-script-")
		if err != nil {
			t.Fatal(err)
		}
		runPython(t, `
import sys, torch
class Net(torch.nn.Module):
    def __init__(self, i: int, h: int, o: int, bn: bool):
        super().__init__()
        self.fc1 = torch.nn.Linear(i, h)
        self.bn = torch.nn.BatchNorm1d(h) if bn else torch.nn.Identity()
        self.fc2 = torch.nn.Linear(h, o)
    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))
class Ender(Net):
    def __init__(self):
        super().__init__(8, 16, 3, False)
        self.register_buffer("ended", torch.zeros(1))
    @torch.jit.export
    def epoch_end(self, epoch: int):
        self.ended.fill_(float(epoch) + 1.0)
torch.manual_seed(0)
d = sys.argv[1]
torch.jit.script(Ender()).save(d + "/ender.pt")
torch.jit.script(Net(8, 16, 3, True)).save(d + "/net.pt")
torch.jit.script(Net(8, 16, 2, False)).save(d + "/two.pt")
torch.jit.script(Net(10, 16, 3, False)).save(d + "/wide.pt")
torch.jit.script(Net(8, 16, 3, False).double()).save(d + "/net64.pt")
`, dir)
		scriptDir = dir
	})
	if scriptDir == "" {
		t.Fatal("making the TorchScript models failed in an earlier test")
	}
	return scriptDir
}

func evaluate(t *testing.T, tr *Trainer) plugin.EvalResult {
	t.Helper()
	ev, err := tr.Evaluate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// forwardRows runs the model on the first rows test samples.
func forwardRows(t *testing.T, tr *Trainer, rows int) ([]int64, []float32) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	d := tr.eval
	idx := make([]uint64, rows)
	for i := range idx {
		idx[i] = uint64(i)
	}
	x := make([]float32, rows*d.Features())
	d.Gather(idx, x, make([]int64, rows), nil)
	out := make([]float32, 1<<12)
	shape, err := tr.model.Forward(x, rows, out)
	if err != nil {
		t.Fatal(err)
	}
	return shape, out
}

func TestTorchScriptModelTrains(t *testing.T) {
	dir := scriptModels(t)
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 512, 8, 3), map[string]any{
		"model": filepath.Join(dir, "net.pt"), "optimizer": "adam", "lr": 0.01, "threads": 1,
	}))
	var names []string
	for _, e := range setup.Layout.Entries {
		names = append(names, e.Name+":"+e.Role.String()+":"+e.DType.String())
	}
	t.Logf("layout %v", names)
	if i := setup.Layout.Index("bn.num_batches_tracked"); i < 0 || setup.Layout.Entries[i].DType != arena.I64 || setup.Layout.Entries[i].Role != arena.Buffer {
		t.Errorf("the BatchNorm step counter should be an i64 buffer in the layout: %v", names)
	}
	_, zc := attach(t, tr, setup)
	if !zc {
		t.Error("a CPU TorchScript model should be zero-copy")
	}
	before := evaluate(t, tr)
	losses := []float64{}
	for e := range uint64(6) {
		losses = append(losses, trainPlan(t, tr, fullPlan(e, setup.Samples)))
	}
	after := evaluate(t, tr)
	t.Logf("epoch losses %.4f; eval loss %.4f -> %.4f, accuracy %.3f -> %.3f", losses, before.Loss, after.Loss, *before.Accuracy, *after.Accuracy)
	if !(losses[len(losses)-1] < losses[0]/2) || !(after.Loss < before.Loss/2) {
		t.Errorf("the loss did not fall: epochs %v, eval %v -> %v", losses, before.Loss, after.Loss)
	}
	if *after.Accuracy < 0.85 {
		t.Errorf("accuracy %.3f on a separable problem", *after.Accuracy)
	}
}

// TestFloat64Model: a float64 TorchScript model also lives in the arena
// (f64 entries, zero-copy on the CPU); its inputs are cast to float64.
func TestFloat64Model(t *testing.T) {
	dir := scriptModels(t)
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 256, 8, 3), map[string]any{"model": filepath.Join(dir, "net64.pt"), "threads": 1}))
	for _, e := range setup.Layout.Entries {
		if e.DType != arena.F64 {
			t.Fatalf("%s is %v", e.Name, e.DType)
		}
	}
	d, zc := attach(t, tr, setup)
	if !zc {
		t.Fatal("want zero-copy")
	}
	first := trainPlan(t, tr, fullPlan(0, setup.Samples))
	last := trainPlan(t, tr, fullPlan(1, setup.Samples))
	if !(last < first) {
		t.Fatalf("loss %v -> %v", first, last)
	}
	clear(openMapping(t, d).Bytes())
	if ev := evaluate(t, tr); math.Abs(ev.Loss-math.Log(3)) > 1e-12 {
		t.Fatalf("a zero f64 arena: loss %v, want ln 3", ev.Loss)
	}
}

// TestArenaWritesReachTheModel writes parameters into the arena through a
// second mapping, as an averager does, and checks that the next forward
// pass and Evaluate use them, with no Adopt in between.
func TestArenaWritesReachTheModel(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}, "threads": 1}))
	d, zc := attach(t, tr, setup)
	if !zc {
		t.Fatal("want zero-copy")
	}
	trainPlan(t, tr, fullPlan(0, setup.Samples))
	m := openMapping(t, d)
	vals := func(name string) []float32 {
		v, err := m.Float32s(d.Layout.Index(name))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// Weights zero, biases set: every output row is fc2.bias.
	clear(vals("fc1.weight"))
	clear(vals("fc2.weight"))
	for i := range vals("fc1.bias") {
		vals("fc1.bias")[i] = 0.3
	}
	bias := []float32{0.5, -1, 2}
	copy(vals("fc2.bias"), bias)
	shape, out := forwardRows(t, tr, 5)
	if !slices.Equal(shape, []int64{5, 3}) {
		t.Fatalf("output shape %v", shape)
	}
	for r := range 5 {
		if !slices.Equal(out[3*r:3*r+3], bias) {
			t.Fatalf("row %d = %v, want the bias-only output %v", r, out[3*r:3*r+3], bias)
		}
	}
	// Evaluate agrees: every prediction is class 2, the loss is the
	// cross entropy of softmax(bias).
	var lse float64
	for _, b := range bias {
		lse += math.Exp(float64(b))
	}
	lse = math.Log(lse)
	var wantLoss, wantAcc float64
	labels := tr.eval.Labels()
	for _, y := range labels {
		wantLoss += lse - float64(bias[y])
		if y == 2 {
			wantAcc++
		}
	}
	wantLoss /= float64(len(labels))
	wantAcc /= float64(len(labels))
	ev := evaluate(t, tr)
	if math.Abs(ev.Loss-wantLoss) > 1e-5 || *ev.Accuracy != wantAcc {
		t.Fatalf("evaluate on the bias-only arena: loss %v accuracy %v, want %v %v", ev.Loss, *ev.Accuracy, wantLoss, wantAcc)
	}

	// The whole arena zero: uniform outputs, loss ln 3.
	clear(m.Bytes())
	ev = evaluate(t, tr)
	if math.Abs(ev.Loss-math.Log(3)) > 1e-6 {
		t.Fatalf("evaluate on a zero arena: loss %v, want ln 3 = %v", ev.Loss, math.Log(3))
	}
	norm, err := tr.Adopt(context.Background(), 0)
	if err != nil || norm != 0 {
		t.Fatalf("Adopt on a zero arena: norm %v, %v", norm, err)
	}
	// Training updates the arena in place.
	trainPlan(t, tr, fullPlan(1, setup.Samples))
	if slices.Max(vals("fc2.bias")) == 0 && slices.Min(vals("fc2.bias")) == 0 {
		t.Fatal("training did not write the arena")
	}
}

// TestCopyMode exercises the path CUDA models take: tensors are not views,
// Publish copies into the arena and Adopt copies back. It runs forced on
// the CPU, and on a GPU where the shim's libtorch sees one.
func TestCopyMode(t *testing.T) {
	for _, c := range []struct {
		name   string
		device string
	}{{"forced-on-cpu", "cpu"}, {"cuda", "cuda"}} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTestTrainer(t)
			if c.device == "cuda" && tr.shim.CUDADevices == 0 {
				t.Skip("this libtorch sees no CUDA device")
			}
			tr.forceCopy = c.device == "cpu"
			setup := configure(t, tr, merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}, "threads": 1, "device": c.device}))
			d, zc := attach(t, tr, setup)
			if zc {
				t.Fatal("a copy-mode model reported zero-copy")
			}
			m := openMapping(t, d)
			trainPlan(t, tr, fullPlan(0, setup.Samples))
			before := evaluate(t, tr)
			clear(m.Bytes())
			if ev := evaluate(t, tr); ev.Loss != before.Loss {
				t.Fatalf("an arena write changed a copy-mode model before Adopt: %v -> %v", before.Loss, ev.Loss)
			}
			if _, err := tr.Adopt(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			if ev := evaluate(t, tr); math.Abs(ev.Loss-math.Log(3)) > 1e-6 {
				t.Fatalf("after Adopt of a zero arena: loss %v, want ln 3", ev.Loss)
			}
			trainPlan(t, tr, fullPlan(1, setup.Samples))
			res, err := tr.Publish(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var sq float64
			for _, e := range d.Layout.Entries {
				v, _ := m.Float32s(d.Layout.Index(e.Name))
				for _, x := range v {
					sq += float64(x) * float64(x)
				}
			}
			if sq == 0 || math.Abs(math.Sqrt(sq)-res.ParamNorm) > 1e-4*res.ParamNorm || res.Steps != 8 || res.StepCount != 8 {
				t.Fatalf("Publish %+v; the arena's norm is %v", res, math.Sqrt(sq))
			}
		})
	}
}

// TestBlendAdopt: with views, Adopt(a) blends the values kept at Publish
// with what the averager wrote: (1-a)·published + a·arena.
func TestBlendAdopt(t *testing.T) {
	for _, copyMode := range []bool{false, true} {
		t.Run(map[bool]string{false: "views", true: "copy"}[copyMode], func(t *testing.T) {
			tr := newTestTrainer(t)
			tr.forceCopy = copyMode
			setup := configure(t, tr, merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}, "threads": 1}))
			d, _ := attach(t, tr, setup)
			m := openMapping(t, d)
			trainPlan(t, tr, fullPlan(0, setup.Samples))
			if _, err := tr.Publish(context.Background()); err != nil {
				t.Fatal(err)
			}
			published := slices.Clone(arena.AsFloat32s(m.Bytes()))
			all := arena.AsFloat32s(m.Bytes())
			for i := range all {
				all[i] = 1 // the "consensus"
			}
			if _, err := tr.Adopt(context.Background(), 0.25); err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Publish(context.Background()); err != nil { // copy mode: show the model
				t.Fatal(err)
			}
			for _, e := range d.Layout.Entries {
				lo, hi := e.Offset/4, (e.Offset+e.Bytes)/4
				for i := lo; i < hi; i++ {
					want := 0.75*published[i] + 0.25
					if math.Abs(float64(all[i]-want)) > 1e-6 {
						t.Fatalf("%s[%d] = %v after Adopt(0.25), want %v", e.Name, i-lo, all[i], want)
					}
				}
			}
			if _, err := tr.Adopt(context.Background(), 1.5); err == nil {
				t.Fatal("Adopt(1.5) succeeded")
			}
		})
	}
}

func TestCheckpointRestoresBitwise(t *testing.T) {
	cases := map[string]map[string]any{
		"mlp-sgd":          {"hidden": []int{16}},
		"mlp-adamw-cosine": {"hidden": []int{16, 8}, "optimizer": "adamw", "lr_schedule": "cosine", "lr_total_steps": 40},
		"torchscript-adam": {"model": "net.pt", "optimizer": "adam"},
	}
	data := synthData(t, 256, 8, 3)
	for name, kv := range cases {
		t.Run(name, func(t *testing.T) {
			if kv["model"] == "net.pt" {
				kv["model"] = filepath.Join(scriptModels(t), "net.pt")
			}
			kv = merge(data, kv, map[string]any{"threads": 1})
			tr := newTestTrainer(t)
			setup := configure(t, tr, kv)
			// The coordinator's default divergence target follows this.
			if want := kv["optimizer"] == "adam" || kv["optimizer"] == "adamw"; setup.AdaptiveOptimizer != want {
				t.Errorf("Configure says adaptive optimizer %v, want %v", setup.AdaptiveOptimizer, want)
			}
			d, _ := attach(t, tr, setup)
			m := openMapping(t, d)
			trainPlan(t, tr, fullPlan(0, setup.Samples))
			trainPlan(t, tr, fullPlan(1, setup.Samples))
			dir := filepath.Join(t.TempDir(), "ckpt")
			files, err := tr.SaveCheckpoint(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			saved := slices.Clone(m.Bytes())
			trainPlan(t, tr, fullPlan(2, setup.Samples))
			continued := slices.Clone(m.Bytes())
			contEval := evaluate(t, tr)

			tr2 := newTestTrainer(t)
			setup2 := configure(t, tr2, kv)
			d2, _ := attach(t, tr2, setup2)
			m2 := openMapping(t, d2)
			res, err := tr2.LoadCheckpoint(context.Background(), dir, plugin.LoadResume)
			if err != nil {
				t.Fatal(err)
			}
			if res.StepCount != 8 {
				t.Errorf("restored %d steps, want 8", res.StepCount)
			}
			if !bytes.Equal(m2.Bytes(), saved) {
				t.Fatal("the restored parameters differ from the saved ones")
			}
			trainPlan(t, tr2, fullPlan(2, setup.Samples))
			if !bytes.Equal(m2.Bytes(), continued) {
				t.Fatal("training after the restore diverged from training on: optimizer state or schedule not restored bitwise")
			}
			if ev := evaluate(t, tr2); ev.Loss != contEval.Loss {
				t.Fatalf("eval loss %v after restore, %v without", ev.Loss, contEval.Loss)
			}
			if len(files) != 4 { // model, optimizer, the exported model.pt, meta
				t.Fatalf("files %v", files)
			}
			// A damaged file is refused, not loaded.
			opt := filepath.Join(dir, CheckpointOptimizer)
			raw, _ := os.ReadFile(opt)
			raw[len(raw)/2] ^= 1
			os.WriteFile(opt, raw, 0o644)
			if _, err := tr2.LoadCheckpoint(context.Background(), dir, plugin.LoadResume); err == nil || !strings.Contains(err.Error(), "does not match") {
				t.Fatalf("a damaged checkpoint: %v", err)
			}
		})
	}
}

// osThread runs functions on an OS thread of its own, as Go's scheduler may
// run any call of the plugin on any thread.
type osThread chan func()

func newOSThread(t *testing.T) osThread {
	c := make(osThread)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for f := range c {
			f()
		}
	}()
	t.Cleanup(func() { close(c) })
	return c
}

func (c osThread) run(f func() error) error {
	done := make(chan error)
	c <- func() { done <- f() }
	return <-done
}

// TestThreadsHoldOnEveryOSThread: a model computes with its own `threads`
// on whichever OS thread a call lands. libtorch's OpenMP backend keeps the
// intra-op thread count per OS thread, so a thread that served a model with
// another setting must not carry its count into this one. The BatchNorm of
// net.pt sums its batch statistics in one slice per thread, so the count
// shows in the bits: the same training on a thread that last ran a
// threads = 2 model must give the same arena as on a fresh one.
func TestThreadsHoldOnEveryOSThread(t *testing.T) {
	dir := scriptModels(t)
	data := synthData(t, 256, 8, 3)
	ctx := context.Background()
	cfg := func(kv map[string]any) plugin.TrainerConfig {
		return plugin.TrainerConfig{WorldSize: 1, LocalRanks: 1, Seed: 7, Settings: settingsJSON(t, merge(data, kv))}
	}
	one := cfg(map[string]any{"model": filepath.Join(dir, "net.pt"), "optimizer": "adam", "threads": 1})
	epoch := func(tr *Trainer, e uint64) func() error {
		return func() error {
			return tr.Train(ctx, fullPlan(e, 256), func(plugin.BatchReport) error { return nil })
		}
	}
	busy, fresh := newOSThread(t), newOSThread(t)

	// busy serves a model with threads = 2 first.
	two := newTestTrainer(t)
	var setup plugin.TrainerSetup
	if err := busy.run(func() (err error) {
		setup, err = two.Configure(ctx, cfg(map[string]any{"hidden": []int{16}, "threads": 2}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	attach(t, two, setup)
	if err := busy.run(epoch(two, 0)); err != nil {
		t.Fatal(err)
	}

	// The same threads = 1 model, configured on fresh, trained on busy and
	// on fresh.
	arenas := make([][]byte, 2)
	for i, on := range []osThread{busy, fresh} {
		tr := newTestTrainer(t)
		if err := fresh.run(func() (err error) {
			setup, err = tr.Configure(ctx, one)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		d, _ := attach(t, tr, setup)
		for e := range uint64(2) {
			if err := on.run(epoch(tr, e)); err != nil {
				t.Fatal(err)
			}
		}
		arenas[i] = slices.Clone(openMapping(t, d).Bytes())
	}
	if !bytes.Equal(arenas[0], arenas[1]) {
		t.Fatal("training a threads = 1 model on an OS thread that ran a threads = 2 model gave other bits than on a fresh thread: the thread count did not follow the model")
	}
}

// TestCheckpointReadableByTorch loads the checkpoint files with Python's
// torch and compares a tensor.
func TestCheckpointReadableByTorch(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 128, 8, 3), map[string]any{"hidden": []int{16}, "threads": 1}))
	d, _ := attach(t, tr, setup)
	trainPlan(t, tr, fullPlan(0, setup.Samples))
	dir := t.TempDir()
	if _, err := tr.SaveCheckpoint(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	out := runPython(t, `
import sys, torch
m = torch.jit.load(sys.argv[1] + "/libtorch-model.pt")
sd = m.state_dict()
print(sorted(sd.keys()))
print(repr(float(sd["fc2.bias"][1])))
o = torch.jit.load(sys.argv[1] + "/libtorch-optimizer.pt")
print("optimizer ok")
`, dir)
	m := openMapping(t, d)
	b, _ := m.Float32s(d.Layout.Index("fc2.bias"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "['fc1.bias', 'fc1.weight', 'fc2.bias', 'fc2.weight']" || lines[2] != "optimizer ok" {
		t.Fatalf("python read:\n%s", out)
	}
	var got float64
	if _, err := fmt.Sscan(lines[1], &got); err != nil || float32(got) != b[1] {
		t.Fatalf("python reads fc2.bias[1] = %s, the arena holds %v", lines[1], b[1])
	}
}

func TestCheckpointRefusesOtherModels(t *testing.T) {
	data := synthData(t, 128, 8, 3)
	tr := newTestTrainer(t)
	configure(t, tr, merge(data, map[string]any{"hidden": []int{16}, "threads": 1}))
	dir := t.TempDir()
	if _, err := tr.SaveCheckpoint(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	tr2 := newTestTrainer(t)
	configure(t, tr2, merge(data, map[string]any{"hidden": []int{8}, "threads": 1}))
	if _, err := tr2.LoadCheckpoint(context.Background(), dir, plugin.LoadResume); err == nil || !strings.Contains(err.Error(), "different model layout") {
		t.Fatalf("loading another model's checkpoint: %v", err)
	}
	if _, err := tr2.LoadCheckpoint(context.Background(), t.TempDir(), plugin.LoadResume); err == nil {
		t.Fatal("loading an empty directory succeeded")
	}
}

// TestBadInputsAreErrors: bad files and models are clear errors from
// Configure (or the step), never a crash.
func TestBadInputsAreErrors(t *testing.T) {
	needTorch(t)
	sdir := scriptModels(t)
	data := synthData(t, 64, 8, 3)
	tmp := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(tmp, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	idx := func(magic uint32, dims []uint32, payload int) []byte {
		b := binary.BigEndian.AppendUint32(nil, magic)
		for _, d := range dims {
			b = binary.BigEndian.AppendUint32(b, d)
		}
		return append(b, make([]byte, payload)...)
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	write("badmagic/train-images-idx3-ubyte", idx(0x12340803, []uint32{2, 28, 28}, 2*784))
	write("badmagic/train-labels-idx1-ubyte", idx(0x00000801, []uint32{2}, 2))
	write("trunc/train-images-idx3-ubyte.gz", gz(idx(0x00000803, []uint32{2, 28, 28}, 784)))
	write("trunc/train-labels-idx1-ubyte.gz", gz(idx(0x00000801, []uint32{2}, 2)))
	full := encodeNPY("<f4", []int{64, 8}, make([]byte, 64*8*4))
	truncNPY := write("trunc.npy", full[:len(full)-100])
	floatY := write("floaty.npy", encodeNPY("<f4", []int{64}, make([]byte, 64*4)))
	garbage := write("garbage.pt", []byte("this is not a TorchScript archive"))

	cases := []struct {
		name string
		kv   map[string]any
		want string
	}{
		{"idx-wrong-magic", map[string]any{"data": filepath.Join(tmp, "badmagic")}, "not an IDX file: magic 0x12340803"},
		{"idx-gzip-truncated", map[string]any{"data": filepath.Join(tmp, "trunc")}, "truncated"},
		{"npy-truncated", merge(data, map[string]any{"data_x": truncNPY}), "truncated"},
		{"float-labels-for-cross-entropy", merge(data, map[string]any{"data_y": floatY}), "cross_entropy needs integer class labels"},
		{"script-output-does-not-fit", merge(data, map[string]any{"model": filepath.Join(sdir, "two.pt")}), "does not fit the labels"},
		{"mlp-outputs-do-not-fit", merge(data, map[string]any{"outputs": 2}), "does not fit the labels"},
		{"mse-output-does-not-fit", merge(data, map[string]any{"loss": "mse", "data_y": floatY, "eval_x": "", "eval_y": "", "outputs": 3}), "does not fit the targets"},
		{"script-wrong-input-width", merge(data, map[string]any{"model": filepath.Join(sdir, "wide.pt")}), "forward pass"},
		{"not-torchscript", merge(data, map[string]any{"model": garbage}), "libtorch model"},
		{"no-such-model", merge(data, map[string]any{"model": filepath.Join(tmp, "nope.pt")}), "not \"mlp\", \"cnn\" or a TorchScript file"},
		{"cnn-on-flat-data", merge(data, map[string]any{"model": "cnn"}), "cnn"},
		{"unknown-key", map[string]any{"learning_rate": 0.1}, "unknown key \"learning_rate\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTestTrainer(t)
			_, err := tr.Configure(context.Background(), plugin.TrainerConfig{WorldSize: 1, Settings: settingsJSON(t, c.kv)})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			t.Logf("%v", err)
		})
	}

	t.Run("cuda-without-cuda", func(t *testing.T) {
		tr := newTestTrainer(t)
		if tr.shim.CUDADevices > 0 {
			t.Skip("this libtorch sees a CUDA device")
		}
		_, err := tr.Configure(context.Background(), plugin.TrainerConfig{WorldSize: 1, Settings: settingsJSON(t, merge(data, map[string]any{"device": "cuda"}))})
		if err == nil || !strings.Contains(err.Error(), "sees no CUDA device") {
			t.Fatalf("device = cuda on a CPU libtorch: %v", err)
		}
		t.Log(err)
	})
	t.Run("label-out-of-range-in-a-step", func(t *testing.T) {
		tr := newTestTrainer(t)
		configure(t, tr, merge(data, map[string]any{"threads": 1}))
		x := make([]float32, 2*8)
		_, err := tr.model.TrainStep(x, 2, []int64{0, 7}, nil, 0, 0.1, make([]byte, shim.ErrBufLen))
		if err == nil || !strings.Contains(err.Error(), "label 7 does not fit the model's 3 outputs") {
			t.Fatalf("error %v", err)
		}
		// The model still works.
		if _, err := tr.model.TrainStep(x, 2, []int64{0, 2}, nil, 0, 0.1, make([]byte, shim.ErrBufLen)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("use-after-shutdown", func(t *testing.T) {
		tr := newTestTrainer(t)
		setup := configure(t, tr, merge(data, map[string]any{"threads": 1}))
		attach(t, tr, setup)
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := tr.Train(context.Background(), fullPlan(0, 64), func(plugin.BatchReport) error { return nil }); err == nil {
			t.Fatal("Train after Shutdown succeeded")
		}
		if _, err := tr.Publish(context.Background()); err == nil {
			t.Fatal("Publish after Shutdown succeeded")
		}
		if _, err := tr.Configure(context.Background(), plugin.TrainerConfig{WorldSize: 1}); err == nil {
			t.Fatal("Configure after Shutdown succeeded")
		}
	})
}

// TestPlanPicksAreTrained: the samples trained are exactly the plan's
// the plan's slice of plugin.Permutation, pick p training sample p % samples, in batches.
func TestPlanPicksAreTrained(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			tr := newTestTrainer(t)
			setup := configure(t, tr, merge(synthData(t, 512, 8, 3), map[string]any{"threads": 1, "batch_size": 50}))
			tr.prefetch = prefetch
			var got []uint64
			var sizes []int
			tr.traceBatch = func(_ uint64, idx []uint64) {
				got = append(got, idx...)
				sizes = append(sizes, len(idx))
			}
			const space = 768 // 1.5 epochs of picks
			counts := make([]int, setup.Samples)
			var steps uint64
			for _, part := range [][2]uint64{{0, 384}, {384, 384}} {
				got, sizes = nil, nil
				plan := plugin.Plan{Epoch: 3, Seed: 11, PickSpace: space, PartitionOffset: part[0], PartitionSize: part[1], GlobalStep: 5}
				var reports int
				if err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
					steps++
					if r.Batch != uint64(reports) || int(r.Samples) != sizes[reports] || r.StepCount != steps {
						t.Fatalf("report %+v for batch %d of %d samples, step %d", r, reports, sizes[reports], steps)
					}
					reports++
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				want := slices.Clone(plugin.Permutation(plan.Seed, plan.Epoch, plan.PickSpace)[part[0] : part[0]+part[1]])
				for i := range want {
					want[i] %= setup.Samples
				}
				if !slices.Equal(got, want) {
					t.Fatalf("partition %v: trained samples differ from the permutation's slice %% samples", part)
				}
				if !slices.Equal(sizes, []int{50, 50, 50, 50, 50, 50, 50, 34}) {
					t.Fatalf("batch sizes %v", sizes)
				}
				for _, s := range got {
					counts[s]++
				}
			}
			for s, c := range counts {
				if want := 1 + btoi(s < space-512); c != want {
					t.Fatalf("sample %d trained %d times, want %d", s, c, want)
				}
			}
			bad := plugin.Plan{Epoch: 0, Seed: 1, PickSpace: 100, PartitionOffset: 90, PartitionSize: 20}
			if err := tr.Train(context.Background(), bad, func(plugin.BatchReport) error { return nil }); err == nil {
				t.Fatal("a partition past the pick space was accepted")
			}
		})
	}
}

func TestSpareCore(t *testing.T) {
	for _, tc := range []struct {
		threads    int
		localRanks uint32
		cores      int
		want       bool
	}{
		{1, 1, 2, true},
		{2, 1, 2, false},
		{1, 4, 2, false},
		{1, 0, 2, true}, // 0 local ranks counts as 1
		{3, 2, 8, true},
		{4, 2, 8, false},
	} {
		if got := spareCore(tc.threads, tc.localRanks, tc.cores); got != tc.want {
			t.Errorf("spareCore(%d threads, %d local ranks, %d cores) = %v, want %v", tc.threads, tc.localRanks, tc.cores, got, tc.want)
		}
	}
	// Configure applies the rule to the trainer's threads on this host.
	data := synthData(t, 64, 8, 3)
	cores := runtime.NumCPU()
	for _, threads := range []int{1, cores} {
		tr := newTestTrainer(t)
		configure(t, tr, merge(data, map[string]any{"threads": threads}))
		if want := threads < cores; tr.prefetch != want {
			t.Errorf("%d threads of %d cores, 1 local rank: prefetch %v, want %v", threads, cores, tr.prefetch, want)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// barImages writes n noisy 8x8 images of a bar (class 0 horizontal, 1
// vertical, 2 diagonal) at a random place, shape [n, 8, 8].
func barImages(t *testing.T, n int) map[string]any {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 6))
	gen := func(n int) ([]float32, []int64) {
		x := make([]float32, n*64)
		y := make([]int64, n)
		for i := range n {
			img := x[i*64 : (i+1)*64]
			for j := range img {
				img[j] = float32(0.3 * rng.NormFloat64())
			}
			c, at := rng.IntN(3), rng.IntN(8)
			for k := range 8 {
				switch c {
				case 0:
					img[at*8+k] += 1
				case 1:
					img[k*8+at] += 1
				case 2:
					img[k*8+(k+at)%8] += 1
				}
			}
			y[i] = int64(c)
		}
		return x, y
	}
	x, y := gen(n)
	ex, ey := gen(n / 2)
	p := func(name string) string { return filepath.Join(dir, name) }
	writeNPY(t, p("x.npy"), "<f4", []int{n, 8, 8}, f32Bytes(x))
	writeNPY(t, p("y.npy"), "<i8", []int{n}, i64Bytes(y))
	writeNPY(t, p("ex.npy"), "<f4", []int{n / 2, 8, 8}, f32Bytes(ex))
	writeNPY(t, p("ey.npy"), "<i8", []int{n / 2}, i64Bytes(ey))
	return map[string]any{"data_x": p("x.npy"), "data_y": p("y.npy"), "eval_x": p("ex.npy"), "eval_y": p("ey.npy")}
}

func TestCNNTrains(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(barImages(t, 1024), map[string]any{"model": "cnn", "threads": 1, "batch_size": 32}))
	if i := setup.Layout.Index("conv1.weight"); i < 0 || !slices.Equal(setup.Layout.Entries[i].Shape, []int64{16, 1, 3, 3}) {
		t.Fatalf("layout %+v", setup.Layout.Entries)
	}
	attach(t, tr, setup)
	first := trainPlan(t, tr, fullPlan(0, setup.Samples))
	var last float64
	for e := uint64(1); e < 6; e++ {
		last = trainPlan(t, tr, fullPlan(e, setup.Samples))
	}
	ev := evaluate(t, tr)
	t.Logf("cnn loss %.4f -> %.4f, test accuracy %.3f", first, last, *ev.Accuracy)
	if !(last < first/2) || *ev.Accuracy < 0.9 {
		t.Fatalf("cnn did not learn: loss %v -> %v, accuracy %v", first, last, *ev.Accuracy)
	}
}

func TestMSERegression(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	const n, f = 512, 4
	x := make([]float32, n*f)
	y := make([]float32, n*2)
	for i := range n {
		for j := range f {
			x[i*f+j] = float32(rng.NormFloat64())
		}
		y[2*i] = x[i*f] - 2*x[i*f+1]
		y[2*i+1] = 0.5 * x[i*f+2] * x[i*f+3]
	}
	writeNPY(t, filepath.Join(dir, "x.npy"), "<f4", []int{n, f}, f32Bytes(x))
	writeNPY(t, filepath.Join(dir, "y.npy"), "<f4", []int{n, 2}, f32Bytes(y))
	tr := newTestTrainer(t)
	setup := configure(t, tr, map[string]any{
		"data_x": filepath.Join(dir, "x.npy"), "data_y": filepath.Join(dir, "y.npy"),
		"eval_x": filepath.Join(dir, "x.npy"), "eval_y": filepath.Join(dir, "y.npy"),
		"loss": "mse", "hidden": []int{32}, "optimizer": "adam", "lr": 0.01, "threads": 1,
	})
	attach(t, tr, setup)
	before := evaluate(t, tr)
	for e := range uint64(10) {
		trainPlan(t, tr, fullPlan(e, n))
	}
	after := evaluate(t, tr)
	t.Logf("mse %.4f -> %.4f", before.Loss, after.Loss)
	if after.Accuracy != nil || !(after.Loss < before.Loss/4) {
		t.Fatalf("mse eval %+v -> %+v", before, after)
	}
}

func TestDescribe(t *testing.T) {
	tr := newTestTrainer(t)
	d, err := tr.Describe(context.Background())
	if err != nil || d.Name != "libtorch" || !regexp.MustCompile(`\(libtorch \d+\.\d+\.\d+, shim ABI \d+\)$`).MatchString(d.Version) || !slices.Contains(d.Capabilities, "zero-copy") {
		t.Fatalf("%+v %v", d, err)
	}
	if gpu := slices.Contains(d.Capabilities, "cuda"); gpu != (tr.shim.CUDADevices > 0) {
		t.Fatalf("capabilities %v with %d CUDA devices", d.Capabilities, tr.shim.CUDADevices)
	}
}

// TestConcurrentCalls: Publish, Adopt and Evaluate interleave with a
// running Train between batches; a second Train is refused; Shutdown during
// Train ends it with an error, not a crash.
func TestConcurrentCalls(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 512, 8, 3), map[string]any{"threads": 1, "batch_size": 8}))
	attach(t, tr, setup)
	ctx := context.Background()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		done <- tr.Train(ctx, plugin.Plan{Seed: 1, PickSpace: 1 << 20, PartitionSize: 1 << 20}, func(plugin.BatchReport) error {
			once.Do(func() { close(started) })
			return nil
		})
	}()
	<-started
	if err := tr.Train(ctx, fullPlan(0, 512), func(plugin.BatchReport) error { return nil }); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("a second Train: %v", err)
	}
	for range 20 {
		if _, err := tr.Publish(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Adopt(ctx, 0.5); err != nil {
			t.Fatal(err)
		}
		evaluate(t, tr)
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "shut down or reconfigured") {
		t.Fatalf("Train across a Shutdown: %v", err)
	}
}

// TestTrainThreadOwnership: every batch of every Train runs on one OS
// thread, the trainer's own, whichever goroutine (and so OS thread) calls
// Train -- gRPC serves each call on its own -- and not on the caller's.
func TestTrainThreadOwnership(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 64, 8, 3), map[string]any{"threads": 1, "batch_size": 8}))
	attach(t, tr, setup)
	tids := map[int]int{}
	tr.traceBatch = func(uint64, []uint64) { tids[unix.Gettid()]++ }
	callers := map[int]bool{}
	for i := range 6 {
		done := make(chan error, 1)
		go func() {
			// Each caller holds its own OS thread, as a fresh one would.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			callers[unix.Gettid()] = true
			done <- tr.Train(context.Background(), plugin.Plan{Epoch: uint64(i), Seed: 1, PickSpace: 64, PartitionSize: 16}, func(plugin.BatchReport) error { return nil })
		}()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if len(tids) != 1 {
		t.Fatalf("batches ran on %d OS threads (%v), want 1", len(tids), tids)
	}
	for tid, n := range tids {
		if n != 12 {
			t.Fatalf("%d batches on the trainer's thread, want 12", n)
		}
		if callers[tid] {
			t.Fatalf("batches ran on a caller's thread %d", tid)
		}
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tr.thread.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the compute thread did not exit after Shutdown")
	}
	if err := tr.Train(context.Background(), fullPlan(0, 64), func(plugin.BatchReport) error { return nil }); err == nil {
		t.Fatal("Train after Shutdown succeeded")
	}
}

// TestLibtorchCallsShareOneThread: every call into libtorch other than
// the batch loop's runs on one OS thread of the trainer's own, the same for
// its whole life, whichever thread the caller is on (gRPC serves each call
// on its own) and not the batch loop's. libtorch starts an OpenMP team and
// a pthreadpool, whose worker spins for some 25 ms, on each new OS thread
// that calls it.
func TestLibtorchCallsShareOneThread(t *testing.T) {
	tr := newTestTrainer(t)
	// Written on the trainer's threads only, read after the call that wrote
	// them returned.
	var calls []int
	tr.traceCall = func() { calls = append(calls, unix.Gettid()) }
	batchTIDs := map[int]bool{}
	tr.traceBatch = func(uint64, []uint64) { batchTIDs[unix.Gettid()] = true }
	ctx := context.Background()
	ckpt := t.TempDir()
	cfg := plugin.TrainerConfig{WorldSize: 1, LocalRanks: 1, Seed: 7,
		Settings: settingsJSON(t, merge(synthData(t, 64, 8, 3), map[string]any{"threads": 2, "batch_size": 8}))}
	var (
		setup plugin.TrainerSetup
		d     arena.Descriptor // made between Configure and Attach
	)
	steps := []struct {
		name string
		call func() error
	}{
		{"Configure", func() (err error) { setup, err = tr.Configure(ctx, cfg); return err }},
		{"Attach", func() error { _, err := tr.Attach(ctx, d); return err }},
		{"Train", func() error {
			return tr.Train(ctx, fullPlan(0, 64), func(plugin.BatchReport) error { return nil })
		}},
		{"Publish", func() error { _, err := tr.Publish(ctx); return err }},
		{"Adopt", func() error { _, err := tr.Adopt(ctx, 0.5); return err }},
		{"Evaluate", func() error { _, err := tr.Evaluate(ctx); return err }},
		{"EpochEnd", func() error { _, err := tr.EpochEnd(ctx, 1); return err }},
		{"SaveCheckpoint", func() error { _, err := tr.SaveCheckpoint(ctx, ckpt); return err }},
		{"LoadCheckpoint", func() error { _, err := tr.LoadCheckpoint(ctx, ckpt, plugin.LoadResume); return err }},
		{"ExportDevice", func() error { _, _, err := tr.ExportDevice(ctx); return err }},
	}
	callers := map[int]bool{}
	for _, st := range steps {
		if st.name == "Attach" {
			d = newArena(t, setup.Layout)
		}
		before := len(calls)
		done := make(chan error, 1)
		go func() {
			// Locked and never unlocked: the thread ends with the call, so
			// each call comes from a thread libtorch has not seen.
			runtime.LockOSThread()
			callers[unix.Gettid()] = true
			done <- st.call()
		}()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.name != "Train" && len(calls) == before {
			t.Fatalf("%s did not run on the trainer's call thread", st.name)
		}
	}
	for _, tid := range calls {
		if tid != calls[0] {
			t.Fatalf("libtorch calls ran on threads %v, want one", calls)
		}
	}
	if callers[calls[0]] || batchTIDs[calls[0]] || len(batchTIDs) != 1 {
		t.Fatalf("call thread %d; callers %v; batches on %v", calls[0], callers, batchTIDs)
	}
}

// A plan's LRScale reaches the optimizer step: 0 trains as 1 does, 0.5
// trains differently, and a scale that is not a finite positive number is
// refused before any batch.
func TestLRScale(t *testing.T) {
	needTorch(t)
	data := synthData(t, 256, 8, 3)
	losses := func(scale float64) ([]float64, error) {
		tr := newTestTrainer(t)
		configure(t, tr, merge(data, map[string]any{"threads": 1, "batch_size": 32}))
		var out []float64
		plan := plugin.Plan{Epoch: 0, Seed: 5, PickSpace: 256, PartitionSize: 96, LRScale: scale}
		err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
			out = append(out, r.Loss)
			return nil
		})
		return out, err
	}
	one, err := losses(1)
	if err != nil {
		t.Fatal(err)
	}
	zero, err := losses(0)
	if err != nil || !slices.Equal(one, zero) {
		t.Errorf("scale 0: losses %v (%v), want scale 1's %v", zero, err, one)
	}
	half, err := losses(0.5)
	if err != nil || half[0] != one[0] || slices.Equal(half[1:], one[1:]) {
		t.Errorf("scale 0.5: losses %v (%v) against %v: want the same first batch, then different steps", half, err, one)
	}
	for _, bad := range []float64{-0.5, math.NaN(), math.Inf(1)} {
		if got, err := losses(bad); err == nil || len(got) > 0 || !strings.Contains(err.Error(), "learning-rate scale") {
			t.Errorf("scale %v: %d batches, %v; want a refusal before training", bad, len(got), err)
		}
	}
}

// sleep_per_batch_by_rank slows only the named rank, and its batch times
// show it.
func TestSleepPerBatchByRank(t *testing.T) {
	needTorch(t)
	data := synthData(t, 64, 8, 3)
	batchMS := func(rank uint32) float64 {
		tr := newTestTrainer(t)
		settings := merge(data, map[string]any{"threads": 1, "batch_size": 16, "sleep_per_batch_by_rank": map[string]string{"1": "30ms"}})
		if _, err := tr.Configure(context.Background(), plugin.TrainerConfig{Rank: rank, WorldSize: 2, LocalRanks: 1, Seed: 1, Settings: settingsJSON(t, settings)}); err != nil {
			t.Fatal(err)
		}
		least := math.Inf(1)
		plan := plugin.Plan{Epoch: 0, Seed: 5, PickSpace: 64, PartitionSize: 64}
		if err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
			least = min(least, r.BatchMS)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return least
	}
	if slow, fast := batchMS(1), batchMS(0); slow < 30 || fast >= 30 {
		t.Errorf("fastest batch: %.1f ms on the slowed rank, %.1f ms on the other; want at least 30 and under 30", slow, fast)
	}
}

// With OverlapRounds the model keeps its tensors out of the arena, and an
// Adopt after steps trained since Publish keeps those steps: a round whose
// average equals what was published changes nothing, while one that moved
// the arena moves the model by as much.
func TestOverlapRoundsCreditSteps(t *testing.T) {
	tr := newTestTrainer(t)
	data := merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}, "threads": 1})
	setup, err := tr.Configure(context.Background(), plugin.TrainerConfig{
		Rank: 0, WorldSize: 1, LocalRanks: 1, Seed: 7, Settings: settingsJSON(t, data), OverlapRounds: true})
	if err != nil {
		t.Fatal(err)
	}
	d, zc := attach(t, tr, setup)
	if zc {
		t.Fatal("OverlapRounds: the model's tensors live in the arena")
	}
	trainPlan(t, tr, fullPlan(0, setup.Samples))
	if _, err := tr.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	trainPlan(t, tr, fullPlan(1, setup.Samples)) // the steps of a round's duration
	trained := evaluate(t, tr)
	if _, err := tr.Adopt(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if ev := evaluate(t, tr); ev.Loss != trained.Loss {
		t.Fatalf("an unchanged arena moved the model: loss %v -> %v (the steps since Publish were lost)", trained.Loss, ev.Loss)
	}
	// No step since that Adopt's Publish point moved: a plain overwrite.
	m := openMapping(t, d)
	if _, err := tr.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	clear(m.Bytes())
	if _, err := tr.Adopt(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if ev := evaluate(t, tr); math.Abs(ev.Loss-math.Log(3)) > 1e-6 {
		t.Fatalf("Adopt of a zero arena with no step since Publish: loss %v, want ln 3", ev.Loss)
	}
}

// A TorchScript model's epoch_end method runs on EpochEnd (here it writes
// epoch+1 into a buffer the arena then shows); a model without one, and
// the built-in MLP, have nothing to run.
func TestEpochEnd(t *testing.T) {
	sdir := scriptModels(t)
	data := synthData(t, 64, 8, 3)
	for _, tc := range []struct {
		model string
		ran   bool
	}{{filepath.Join(sdir, "ender.pt"), true}, {filepath.Join(sdir, "net.pt"), false}, {"mlp", false}} {
		t.Run(filepath.Base(tc.model), func(t *testing.T) {
			tr := newTestTrainer(t)
			kv := merge(data, map[string]any{"threads": 1, "model": tc.model})
			if tc.model == "mlp" {
				kv["hidden"] = []int{4}
			}
			setup := configure(t, tr, kv)
			d, _ := attach(t, tr, setup)
			ran, err := tr.EpochEnd(context.Background(), 4)
			if err != nil || ran != tc.ran {
				t.Fatalf("EpochEnd: ran %v (%v), want %v", ran, err, tc.ran)
			}
			if !tc.ran {
				return
			}
			if _, err := tr.Publish(context.Background()); err != nil {
				t.Fatal(err)
			}
			m := openMapping(t, d)
			v, err := m.Float32s(d.Layout.Index("ended"))
			if err != nil || v[0] != 5 {
				t.Fatalf("buffer ended = %v (%v), want 5", v, err)
			}
		})
	}
}

// TestEvaluateHoldsNoMemory: once warm, an evaluation allocates nothing
// the size of its test split. The Go heap holds the data set, so the
// collector lets garbage grow to about its size before it runs: a chunk
// buffer made per call (here 1 MB, 3 MB for Fashion-MNIST) grew the
// evaluating rank's trainer by that much every epoch of a long run.
func TestEvaluateHoldsNoMemory(t *testing.T) {
	tr := newTestTrainer(t)
	const features = 256
	setup := configure(t, tr, merge(synthData(t, 4000, features, 3), map[string]any{
		"model": "mlp", "hidden": []int{16}, "eval_batch_size": 1000,
	}))
	attach(t, tr, setup)
	first := evaluate(t, tr)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const evals = 20
	for range evals {
		if ev := evaluate(t, tr); ev.Loss != first.Loss || *ev.Accuracy != *first.Accuracy {
			t.Fatalf("evaluation changed without training: %+v, then %+v", first, ev)
		}
	}
	runtime.ReadMemStats(&after)
	chunk := uint64(1000 * features * 4)
	if got := (after.TotalAlloc - before.TotalAlloc) / evals; got >= chunk/16 {
		t.Fatalf("an evaluation allocates %d bytes, want less than %d (a 16th of one chunk of test samples)", got, chunk/16)
	}
}

// TestAverageMoments: with adam and adamw the layout holds each trained
// parameter's first moment as a buffer, and it is the optimizer's own:
// training fills it in the arena, and what a round leaves there is what
// the next step continues from.
func TestAverageMoments(t *testing.T) {
	data := synthData(t, 256, 8, 3)
	moments := func(l arena.Layout) []string {
		var names []string
		for _, e := range l.Entries {
			if strings.HasPrefix(e.Name, "optimizer.exp_avg.") {
				if e.Role != arena.Buffer || e.DType != arena.F32 {
					t.Fatalf("moment %q is a %v %v, want an f32 buffer", e.Name, e.Role, e.DType)
				}
				names = append(names, e.Name)
			}
		}
		return names
	}
	for _, tc := range []struct {
		name string
		kv   map[string]any
		want []string
	}{
		{"adamw by default", map[string]any{"optimizer": "adamw"}, []string{"optimizer.exp_avg.fc1.weight", "optimizer.exp_avg.fc1.bias", "optimizer.exp_avg.fc2.weight", "optimizer.exp_avg.fc2.bias"}},
		{"adam by default", map[string]any{"optimizer": "adam"}, []string{"optimizer.exp_avg.fc1.weight", "optimizer.exp_avg.fc1.bias", "optimizer.exp_avg.fc2.weight", "optimizer.exp_avg.fc2.bias"}},
		{"adamw, off", map[string]any{"optimizer": "adamw", "average_moments": false}, nil},
		{"sgd", map[string]any{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTestTrainer(t)
			setup := configure(t, tr, merge(data, tc.kv, map[string]any{"hidden": []int{16}, "threads": 1}))
			got := moments(setup.Layout)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("moments in the layout %v, want %v", got, tc.want)
			}
			if len(got) == 0 {
				return
			}
			d, _ := attach(t, tr, setup)
			m := openMapping(t, d)
			vals := func(name string) []float32 {
				v, err := m.Float32s(d.Layout.Index(name))
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			trainPlan(t, tr, fullPlan(0, setup.Samples))
			mom := vals("optimizer.exp_avg.fc2.bias")
			if slices.Max(mom) == 0 && slices.Min(mom) == 0 {
				t.Fatal("training left the arena's first moment at zero: the optimizer keeps another")
			}
			// A huge moment in the arena (as a round might leave one) moves
			// the next step's parameters far more than training alone.
			before := slices.Clone(vals("fc2.bias"))
			for i := range mom {
				mom[i] = 1e3
			}
			plan := plugin.Plan{Epoch: 1, PartitionSize: 1, Seed: 1, PickSpace: setup.Samples}
			trainPlan(t, tr, plan)
			after := vals("fc2.bias")
			for i := range after {
				// Adam's step is about lr·m/√v: with m = 1e3·β1 and √v near
				// the gradients' size, far over lr (0.001).
				if !(before[i]-after[i] > 0.002) {
					t.Fatalf("fc2.bias[%d] went %v -> %v: the step did not use the arena's moment", i, before[i], after[i])
				}
			}
		})
	}
	tr := newTestTrainer(t)
	if _, err := tr.Configure(context.Background(), plugin.TrainerConfig{Rank: 0, WorldSize: 1, LocalRanks: 1, Seed: 7,
		Settings: settingsJSON(t, merge(data, map[string]any{"average_moments": true}))}); err == nil || !strings.Contains(err.Error(), "average_moments") {
		t.Fatalf("average_moments with sgd: %v", err)
	}
}

// TestCohortSecondMoment: after a round, what a rank's second moment
// gained since the previous round is resized to a batch as many times
// larger as the round averaged ranks (not the world's: some may be dead),
// where the averaged first moment says the gradient is noise, and kept
// where it says it is signal. The next step shows it: Adam's step is
// lr·m/√v.
func TestCohortSecondMoment(t *testing.T) {
	data := synthData(t, 256, 8, 3)
	// step trains a rank of world ranks for 100 steps, runs a round of
	// members ranks (this one among them) that leaves moment in every first
	// moment, trains one more step (the same batch size, whose square adds a
	// hundredth of what the 100 put in v) and returns how far that step
	// moved fc2.bias.
	step := func(t *testing.T, world, members uint32, on bool, moment float32) []float64 {
		tr := newTestTrainer(t)
		setup, err := tr.Configure(context.Background(), plugin.TrainerConfig{Rank: 0, WorldSize: world, LocalRanks: 1, Seed: 7,
			Settings: settingsJSON(t, merge(data, map[string]any{"hidden": []int{16}, "threads": 1, "optimizer": "adam", "lr": 0.01, "cohort_second_moment": on}))})
		if err != nil {
			t.Fatal(err)
		}
		d, _ := attach(t, tr, setup)
		m := openMapping(t, d)
		vals := func(name string) []float32 {
			v, err := m.Float32s(d.Layout.Index(name))
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		for epoch := range uint64(25) {
			trainPlan(t, tr, fullPlan(epoch, setup.Samples))
		}
		if _, err := tr.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Layout.Entries {
			if strings.HasPrefix(e.Name, "optimizer.exp_avg.") {
				mom := vals(e.Name)
				for i := range mom {
					mom[i] = moment
				}
			}
		}
		if on && world > 1 {
			// The round's mean of every rank's one-hot members entry.
			mem := vals("optimizer.cohort_members")
			if len(mem) != int(world) || mem[0] != 1 || slices.Max(mem[1:]) != 0 {
				t.Fatalf("rank 0's optimizer.cohort_members before the round = %v, want 1 and %d zeros", mem, world-1)
			}
			for i := range mem {
				mem[i] = 0
				if i < int(members) {
					mem[i] = 1 / float32(members)
				}
			}
		}
		if _, err := tr.Adopt(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		before := slices.Clone(vals("fc2.bias"))
		trainPlan(t, tr, plugin.Plan{Epoch: 25, PartitionSize: 64, Seed: 1, PickSpace: setup.Samples})
		after := vals("fc2.bias")
		moved := make([]float64, len(after))
		for i := range after {
			moved[i] = math.Abs(float64(after[i] - before[i]))
		}
		return moved
	}
	for _, tc := range []struct {
		name           string
		world, members uint32
		moment         float32 // the round's mean first moment: 0 is all noise, 1e3 all signal
		min, max       float64 // the step's length against the same rank's without the setting
	}{
		{"one rank", 1, 1, 0, 1, 1},
		// √((1+0.01)/(1/4+0.01)) = 1.97; √((1+0.01)/(1/9+0.01)) = 2.89
		{"4 ranks, noise", 4, 4, 0, 1.9, 2.001},
		{"9 ranks, noise", 9, 9, 0, 2.75, 3.001},
		{"4 ranks, signal", 4, 4, 1e3, 0.999, 1.001},
		// Two of 4 dead: √((1+0.01)/(1/2+0.01)) = 1.41, where the world's
		// count would give 1.97.
		{"2 of 4 ranks, noise", 4, 2, 0, 1.38, 1.42},
		// A broadcast, or a round only this rank trained in.
		{"1 of 4 ranks", 4, 1, 0, 0.999, 1.001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			off := step(t, tc.world, tc.members, false, tc.moment)
			on := step(t, tc.world, tc.members, true, tc.moment)
			for i := range on {
				if r := on[i] / off[i]; !(r >= tc.min && r <= tc.max) {
					t.Fatalf("fc2.bias[%d] moved %v, without cohort_second_moment %v: %.4f times as far, want %v to %v",
						i, on[i], off[i], r, tc.min, tc.max)
				}
			}
		})
	}
}
