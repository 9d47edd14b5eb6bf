package softmax

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// start configures and attaches a trainer with settings (JSON) as rank 0
// of 1.
func start(t *testing.T, settings string) (*Trainer, plugin.TrainerSetup, *arena.Owned) {
	t.Helper()
	ctx := context.Background()
	tr := New(nil)
	t.Cleanup(func() { tr.Shutdown(ctx) })
	setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, Seed: 5, Settings: json.RawMessage(settings)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := arena.Create(t.TempDir(), "softmax", setup.Layout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Remove() })
	if zc, err := tr.Attach(ctx, a.Descriptor()); err != nil || !zc {
		t.Fatalf("Attach = %v, %v; want zero copy", zc, err)
	}
	return tr, setup, a
}

func epoch(e uint64, setup plugin.TrainerSetup) plugin.Plan {
	return plugin.Plan{Epoch: e, Seed: 5, PickSpace: setup.Samples, PartitionSize: setup.Samples}
}

func train(t *testing.T, tr *Trainer, p plugin.Plan) {
	t.Helper()
	if err := tr.Train(context.Background(), p, func(plugin.BatchReport) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func accuracy(t *testing.T, tr *Trainer) float64 {
	t.Helper()
	r, err := tr.Evaluate(context.Background())
	if err != nil || r.Accuracy == nil {
		t.Fatalf("Evaluate = %+v, %v", r, err)
	}
	return *r.Accuracy
}

// Training writes the arena itself: no Publish between the steps and the
// arena's bytes, and the synthetic classes are learnt.
func TestTrainsInPlace(t *testing.T) {
	tr, setup, a := start(t, "")
	before := slices.Clone(a.Bytes())
	chance := accuracy(t, tr)
	for e := range uint64(3) {
		train(t, tr, epoch(e, setup))
	}
	if slices.Equal(before, a.Bytes()) {
		t.Fatal("three epochs left the arena as it was: the model does not train in it")
	}
	got := accuracy(t, tr)
	if got < 0.9 || got <= chance {
		t.Errorf("accuracy %.3f after 3 epochs (%.3f before), want 0.9 or more", got, chance)
	}
	t.Logf("accuracy %.3f after 3 epochs, %.3f before", got, chance)
}

// On Fashion-MNIST a quarter of an epoch of a softmax classifier reaches
// about 76% (one epoch about 82%).
func TestFashionMNIST(t *testing.T) {
	dir := os.Getenv("COHORT_FASHION_MNIST")
	if dir == "" {
		dir = "/usr/share/datasets/fashion-mnist"
	}
	if _, err := os.Stat(filepath.Join(dir, trainImages)); err != nil {
		t.Fatalf("Fashion-MNIST is not in %s (%v): install Debian's dataset-fashion-mnist or set COHORT_FASHION_MNIST", dir, err)
	}
	tr, setup, _ := start(t, `{"data": "`+dir+`", "batch_size": 64, "lr": 0.05}`)
	if setup.Samples != 60000 || setup.EvalSamples != 10000 || setup.Layout.Size < 4*7850 {
		t.Fatalf("setup %+v, want Fashion-MNIST's 60000 and 10000 rows and 7850 parameters", setup)
	}
	quarter := epoch(0, setup)
	quarter.PartitionSize /= 4
	train(t, tr, quarter)
	got := accuracy(t, tr)
	if got < 0.75 {
		t.Errorf("accuracy %.3f after %d samples, want 0.75 or more", got, quarter.PartitionSize)
	}
	t.Logf("accuracy %.3f after %d samples", got, quarter.PartitionSize)
}

// A checkpoint whose files do not match its metadata, or of another
// layout, is refused and leaves the trainer as it was.
func TestCheckpointRefusals(t *testing.T) {
	ctx := context.Background()
	tr, setup, _ := start(t, SmallSettings)
	train(t, tr, epoch(0, setup))
	dir := t.TempDir()
	files, err := tr.SaveCheckpoint(ctx, dir)
	if err != nil || len(files) != 3 {
		t.Fatalf("SaveCheckpoint = %v, %v", files, err)
	}
	for _, c := range []struct {
		name, want string
		spoil      func(d string)
		settings   string
	}{
		{"flipped byte", "does not match the SHA-256", func(d string) {
			p := filepath.Join(d, VelocityFile)
			b, _ := os.ReadFile(p)
			b[3] ^= 1
			os.WriteFile(p, b, 0o644)
		}, SmallSettings},
		{"truncated", "holds 4 bytes", func(d string) { os.WriteFile(filepath.Join(d, ParamsFile), []byte{1, 2, 3, 4}, 0o644) }, SmallSettings},
		{"no metadata", "no such file", func(d string) { os.Remove(filepath.Join(d, MetaFile)) }, SmallSettings},
		{"other layout", "another model layout", func(string) {}, strings.Replace(SmallSettings, `"classes": 4`, `"classes": 5`, 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			for _, f := range files {
				b, _ := os.ReadFile(f)
				os.WriteFile(filepath.Join(d, filepath.Base(f)), b, 0o644)
			}
			c.spoil(d)
			fresh, _, a := start(t, c.settings)
			before := slices.Clone(a.Bytes())
			if _, err := fresh.LoadCheckpoint(ctx, d, plugin.LoadResume); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("LoadCheckpoint = %v, want an error saying %q", err, c.want)
			}
			if !slices.Equal(before, a.Bytes()) {
				t.Error("a refused checkpoint changed the model")
			}
		})
	}
}

// Settings are checked: a typo fails, as do values out of range.
func TestSettings(t *testing.T) {
	for raw, want := range map[string]string{
		`{"lr": 0}`:                  "lr = 0",
		`{"batch_sise": 8}`:          `unknown key "batch_sise"`,
		`{"classes": 300}`:           "classes = 300",
		`{"features": 0}`:            "features = 0",
		`{"momentum": -0.1}`:         "momentum = -0.1",
		`{"samples": 1000000000000}`: "more synthetic data",
		`{"data": "/no/dir"}`:        "no such file",
	} {
		_, err := New(nil).Configure(context.Background(), plugin.TrainerConfig{WorldSize: 1, Settings: json.RawMessage(raw)})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Configure(%s) = %v, want an error saying %q", raw, err, want)
		}
	}
}
