package trainer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The tests that need libtorch build the shim first (make -f ../../shim.mk, into
// plugins/trainer-libtorch/build/; make keeps it up to date) unless $COHORT_TORCH_SHIM names one.
// They are skipped, with the reason, only where the libtorch headers are
// missing.

// torchSkip is why libtorch tests cannot run here ("" when they can).
var torchSkip string

func TestMain(m *testing.M) {
	if os.Getenv(shim.Env) == "" {
		path, skip, err := buildShim()
		switch {
		case err != nil:
			fmt.Fprintf(os.Stderr, "building the libtorch shim failed: %v\n", err)
			os.Exit(1)
		case skip != "":
			torchSkip = skip
			fmt.Fprintf(os.Stderr, "SKIPPING the libtorch tests: %s\n", skip)
		default:
			os.Setenv(shim.Env, path)
		}
	}
	code := m.Run()
	if scriptDir != "" {
		os.RemoveAll(scriptDir) // scriptModels' directory outlives each test
	}
	os.Exit(code)
}

// buildShim runs shim.mk; skip is set when libtorch's headers are absent.
func buildShim() (path, skip string, err error) {
	hdr := "/usr/include/torch/csrc/api/include/torch/torch.h"
	if lt := os.Getenv("LIBTORCH"); lt != "" {
		hdr = filepath.Join(lt, "include/torch/csrc/api/include/torch/torch.h")
	}
	if _, err := os.Stat(hdr); err != nil {
		return "", fmt.Sprintf("libtorch headers not found (%s): install libtorch-dev or set LIBTORCH=/path/to/libtorch", hdr), nil
	}
	out, err := filepath.Abs(filepath.Join("..", "..", "build", shim.File))
	if err != nil {
		return "", "", err
	}
	cmd := exec.Command("make", "--no-print-directory", "-f", "../../shim.mk", "SHIM_OUT="+out, "shim")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make -f shim.mk: %v\n%s", err, msg)
	}
	return out, "", nil
}

func needTorch(t testing.TB) {
	t.Helper()
	if torchSkip != "" {
		t.Skip(torchSkip)
	}
}

// newTestTrainer loads the shim and returns a trainer shut down at cleanup.
func newTestTrainer(t testing.TB) *Trainer {
	t.Helper()
	needTorch(t)
	tr, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	return tr
}

func settingsJSON(t testing.TB, kv map[string]any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(kv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func configure(t testing.TB, tr *Trainer, kv map[string]any) plugin.TrainerSetup {
	t.Helper()
	setup, err := tr.Configure(context.Background(), plugin.TrainerConfig{
		Rank: 0, WorldSize: 1, LocalRanks: 1, Seed: 7, Settings: settingsJSON(t, kv),
	})
	if err != nil {
		t.Fatal(err)
	}
	return setup
}

// newArena creates a zeroed arena file for layout and returns its
// descriptor.
func newArena(t testing.TB, layout arena.Layout) arena.Descriptor {
	t.Helper()
	dir := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "cohort-libtorch-test-"); err == nil {
			dir = d
			t.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	path := filepath.Join(dir, "arena")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(layout.Size)); err != nil {
		t.Fatal(err)
	}
	return arena.Descriptor{Path: path, Layout: layout}
}

// attach creates an arena for the trainer's layout and attaches it.
func attach(t testing.TB, tr *Trainer, setup plugin.TrainerSetup) (arena.Descriptor, bool) {
	t.Helper()
	d := newArena(t, setup.Layout)
	zc, err := tr.Attach(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	return d, zc
}

// openMapping maps the arena a second time, as an averager in another
// process would.
func openMapping(t testing.TB, d arena.Descriptor) *arena.Mapping {
	t.Helper()
	m, err := arena.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// fullPlan covers picks 0..pickSpace of an epoch.
func fullPlan(epoch, pickSpace uint64) plugin.Plan {
	return plugin.Plan{Epoch: epoch, PartitionSize: pickSpace, Seed: 1, PickSpace: pickSpace}
}

// trainPlan runs plan and returns the mean batch loss.
func trainPlan(t testing.TB, tr *Trainer, plan plugin.Plan) float64 {
	t.Helper()
	var sum float64
	var n int
	err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
		sum += r.Loss
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// writeNPY writes a little-endian .npy file.
func writeNPY(t testing.TB, path, descr string, shape []int, payload []byte) {
	t.Helper()
	if err := os.WriteFile(path, encodeNPY(descr, shape, payload), 0o644); err != nil {
		t.Fatal(err)
	}
}

func encodeNPY(descr string, shape []int, payload []byte) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	tuple := strings.Join(dims, ", ")
	if len(shape) == 1 {
		tuple += ","
	}
	head := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, tuple)
	for (10+len(head)+1)%64 != 0 {
		head += " "
	}
	head += "\n"
	var b bytes.Buffer
	b.WriteString("\x93NUMPY")
	b.Write([]byte{1, 0})
	binary.Write(&b, binary.LittleEndian, uint16(len(head)))
	b.WriteString(head)
	b.Write(payload)
	return b.Bytes()
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func i64Bytes(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// synthData writes a small separable classification problem as .npy files
// (n samples of `features` float32 values, `classes` int64 labels: the
// argmax of a fixed random projection) and returns the settings keys.
func synthData(t testing.TB, n, features, classes int) map[string]any {
	t.Helper()
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	w := make([]float32, features*classes)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	gen := func(n int) ([]float32, []int64) {
		x := make([]float32, n*features)
		y := make([]int64, n)
		for i := range n {
			best, arg := float32(math.Inf(-1)), 0
			for c := range classes {
				var s float32
				for j := range features {
					if c == 0 {
						x[i*features+j] = float32(rng.NormFloat64())
					}
					s += x[i*features+j] * w[c*features+j]
				}
				if s > best {
					best, arg = s, c
				}
			}
			y[i] = int64(arg)
		}
		return x, y
	}
	x, y := gen(n)
	ex, ey := gen(n / 2)
	p := func(name string) string { return filepath.Join(dir, name) }
	writeNPY(t, p("x.npy"), "<f4", []int{n, features}, f32Bytes(x))
	writeNPY(t, p("y.npy"), "<i8", []int{n}, i64Bytes(y))
	writeNPY(t, p("ex.npy"), "<f4", []int{n / 2, features}, f32Bytes(ex))
	writeNPY(t, p("ey.npy"), "<i8", []int{n / 2}, i64Bytes(ey))
	return map[string]any{"data_x": p("x.npy"), "data_y": p("y.npy"), "eval_x": p("ex.npy"), "eval_y": p("ey.npy")}
}

func merge(maps ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// pythonEnv names another interpreter with torch for the tests (a GPU host's
// virtual environment, say); the default is Debian's, which python3-torch
// installs into.
const pythonEnv = "COHORT_TEST_PYTHON"

func python3() string {
	if p := os.Getenv(pythonEnv); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

// runPython runs a Python snippet with torch available, failing the test
// with install advice when it is not.
func runPython(t testing.TB, script string, args ...string) string {
	t.Helper()
	if err := exec.Command(python3(), "-c", "import torch").Run(); err != nil {
		t.Fatalf("%s cannot import torch (%v): install python3-torch or name one that can in $%s", python3(), err, pythonEnv)
	}
	// A file, not -c: torch.jit.script reads the classes' source.
	path := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python3(), append([]string{path}, args...)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	return string(out)
}
