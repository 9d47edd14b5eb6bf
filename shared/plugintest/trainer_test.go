package plugintest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// configure makes a configured in-process trainer.
func configure(t *testing.T, rank, world uint32, seed uint64, s TrainerSettings) (*Trainer, plugin.TrainerSetup) {
	t.Helper()
	tr := NewTrainer(nil)
	setup, err := tr.Configure(context.Background(), plugin.TrainerConfig{Rank: rank, WorldSize: world, Seed: seed, Settings: s.JSON()})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	return tr, setup
}

// newArena creates an arena for layout in a temp dir, removed at cleanup.
func newArena(t *testing.T, layout arena.Layout) *arena.Owned {
	t.Helper()
	a, err := arena.Create(t.TempDir(), "plugintest", layout)
	if err != nil {
		t.Fatalf("create arena: %v", err)
	}
	t.Cleanup(func() { a.Remove() })
	return a
}

// attach gives tr a new arena of its layout.
func attach(t *testing.T, tr *Trainer, setup plugin.TrainerSetup) *arena.Owned {
	t.Helper()
	a := newArena(t, setup.Layout)
	zero, err := tr.Attach(context.Background(), a.Descriptor())
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if zero {
		t.Fatal("Attach reported zero copy; the mock copies")
	}
	return a
}

// floats is entry i of a as float32s.
func floats(t *testing.T, m *arena.Mapping, i int) []float32 {
	t.Helper()
	v, err := m.Float32s(i)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// train runs one plan and collects its reports.
func train(t *testing.T, tr *Trainer, plan plugin.Plan) []plugin.BatchReport {
	t.Helper()
	var reps []plugin.BatchReport
	if err := tr.Train(context.Background(), plan, func(r plugin.BatchReport) error {
		reps = append(reps, r)
		return nil
	}); err != nil {
		t.Fatalf("Train %+v: %v", plan, err)
	}
	return reps
}

func fullEpoch(seed, epoch, samples uint64) plugin.Plan {
	return plugin.Plan{Epoch: epoch, Seed: seed, PickSpace: samples, PartitionSize: samples}
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func small() TrainerSettings {
	s := DefaultTrainerSettings()
	s.Samples, s.EvalSamples, s.Features, s.BatchSize = 256, 64, 8, 16
	return s
}

func TestTrainerSettings(t *testing.T) {
	cases := []struct {
		name     string
		json     string
		wantErr  string
		features int64
		samples  uint64
		eval     uint64
		batch    uint32
	}{
		{name: "empty is defaults", json: "", features: 16, samples: 2048, eval: 512, batch: 32},
		{name: "null is defaults", json: "null", features: 16, samples: 2048, eval: 512, batch: 32},
		{name: "some keys", json: `{"features": 4, "batch_size": 7, "sleep_per_batch": "1ms", "ledger": ""}`, features: 4, samples: 2048, eval: 512, batch: 7},
		{name: "unknown key", json: `{"featurez": 4}`, wantErr: "unknown key"},
		{name: "trailing data", json: `{"features": 4} {}`, wantErr: "trailing"},
		{name: "not an object", json: `[1]`, wantErr: "the settings are a JSON array, want a JSON object"},
		{name: "zero samples", json: `{"samples": 0}`, wantErr: "samples = 0"},
		{name: "negative samples", json: `{"samples": -1}`, wantErr: `key "samples": got a JSON number -1`},
		{name: "zero eval", json: `{"eval_samples": 0}`, wantErr: "eval_samples = 0"},
		{name: "too many features", json: fmt.Sprintf(`{"features": %d}`, MaxFeatures+1), wantErr: "features ="},
		{name: "zero batch", json: `{"batch_size": 0}`, wantErr: "batch_size"},
		{name: "zero lr", json: `{"lr": 0}`, wantErr: "lr ="},
		{name: "bad sleep", json: `{"sleep_per_batch": "soon"}`, wantErr: "sleep_per_batch"},
		{name: "negative sleep", json: `{"sleep_per_batch": "-1s"}`, wantErr: "sleep_per_batch"},
		{name: "ledger in a missing dir", json: `{"ledger": "/nonexistent/dir/ledger"}`, wantErr: "ledger"},
		{name: "sleep by rank", json: `{"sleep_per_batch_by_rank": {"0": "2ms", "7": "1s"}}`, features: 16, samples: 2048, eval: 512, batch: 32},
		{name: "sleep by rank, bad key", json: `{"sleep_per_batch_by_rank": {"zero": "2ms"}}`, wantErr: "not a rank"},
		{name: "sleep by rank, bad value", json: `{"sleep_per_batch_by_rank": {"0": "-2ms"}}`, wantErr: "sleep_per_batch_by_rank"},
		{name: "optimizer", json: `{"lr_decay": 0.5, "momentum": 0.9, "zero_copy": true}`, features: 16, samples: 2048, eval: 512, batch: 32},
		{name: "negative lr_decay", json: `{"lr_decay": -0.1}`, wantErr: "lr_decay = -0.1"},
		{name: "momentum 1", json: `{"momentum": 1}`, wantErr: "momentum = 1, want a number in [0, 1)"},
		{name: "negative momentum", json: `{"momentum": -0.5}`, wantErr: "momentum = -0.5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := NewTrainer(nil)
			defer tr.Shutdown(context.Background())
			setup, err := tr.Configure(context.Background(), plugin.TrainerConfig{WorldSize: 1, Settings: []byte(c.json)})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Configure(%s) = %v, want an error containing %q", c.json, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Configure(%s): %v", c.json, err)
			}
			if setup.Samples != c.samples || setup.EvalSamples != c.eval || setup.BatchSize != c.batch {
				t.Errorf("setup = %+v, want samples %d, eval %d, batch %d", setup, c.samples, c.eval, c.batch)
			}
			want := []struct {
				name string
				n    int64
				role arena.Role
			}{{"weight", c.features, arena.Parameter}, {"bias", 1, arena.Parameter}, {"feature_mean", c.features, arena.Buffer}}
			if len(setup.Layout.Entries) != len(want) {
				t.Fatalf("layout has %d entries, want %d", len(setup.Layout.Entries), len(want))
			}
			for i, w := range want {
				e := setup.Layout.Entries[i]
				if e.Name != w.name || e.DType != arena.F32 || len(e.Shape) != 1 || e.Shape[0] != w.n || e.Role != w.role {
					t.Errorf("entry %d = %+v, want %s f32 [%d] %v", i, e, w.name, w.n, w.role)
				}
			}
		})
	}
	t.Run("bad rank", func(t *testing.T) {
		if _, err := NewTrainer(nil).Configure(context.Background(), plugin.TrainerConfig{Rank: 2, WorldSize: 2}); err == nil {
			t.Fatal("rank 2 of 2 was accepted")
		}
	})
}

func TestTrainerLearns(t *testing.T) {
	const seed, epochs = 7, 5
	s := DefaultTrainerSettings()
	tr, setup := configure(t, 0, 1, seed, s)
	ctx := context.Background()
	before, err := tr.Evaluate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(before.Loss-math.Ln2) > 1e-12 || before.Samples != s.EvalSamples {
		t.Fatalf("untrained eval = %+v, want loss ln 2 over %d samples", before, s.EvalSamples)
	}
	wantBatches := int((setup.Samples + uint64(s.BatchSize) - 1) / uint64(s.BatchSize))
	var epochLoss []float64
	var step uint64
	for e := range uint64(epochs) {
		reps := train(t, tr, fullEpoch(seed, e, setup.Samples))
		if len(reps) != wantBatches {
			t.Fatalf("epoch %d: %d reports, want %d", e, len(reps), wantBatches)
		}
		var sum float64
		var samples uint64
		for i, r := range reps {
			step++
			if r.Batch != uint64(i) || r.StepCount != step {
				t.Fatalf("epoch %d report %d: batch %d step %d, want %d and %d", e, i, r.Batch, r.StepCount, i, step)
			}
			if (r.ParamNorm != nil) != (step%10 == 0) {
				t.Fatalf("step %d: param norm present = %v", step, r.ParamNorm != nil)
			}
			if r.Loss <= 0 || r.BatchMS < 0 || r.DataMS < 0 || r.DataMS > r.BatchMS {
				t.Fatalf("step %d: implausible report %+v", step, r)
			}
			sum += r.Loss
			samples += uint64(r.Samples)
		}
		if samples != setup.Samples {
			t.Fatalf("epoch %d trained %d samples, want %d", e, samples, setup.Samples)
		}
		epochLoss = append(epochLoss, sum/float64(len(reps)))
	}
	for e := 1; e < epochs; e++ {
		if epochLoss[e] >= epochLoss[e-1] {
			t.Errorf("epoch %d mean loss %.4f did not fall from %.4f", e, epochLoss[e], epochLoss[e-1])
		}
	}
	after, err := tr.Evaluate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Loss > 0.5*before.Loss || *after.Accuracy < 0.85 {
		t.Errorf("after %d epochs eval = loss %.4f accuracy %.3f; want loss below %.4f and accuracy over 0.85", epochs, after.Loss, *after.Accuracy, 0.5*before.Loss)
	}
	_, _, steps, trained := tr.Snapshot()
	if steps != step || trained != epochs*setup.Samples {
		t.Errorf("Snapshot steps %d trained %d, want %d and %d", steps, trained, step, epochs*setup.Samples)
	}
	t.Logf("epoch losses %.4f, eval %.4f → %.4f accuracy %.3f", epochLoss, before.Loss, after.Loss, *after.Accuracy)
}

func TestTrainerDeterministic(t *testing.T) {
	run := func(seed uint64) ([]float32, []float32) {
		tr, setup := configure(t, 0, 1, seed, small())
		train(t, tr, fullEpoch(seed, 0, setup.Samples))
		w, b, _, _ := tr.Snapshot()
		return w, b
	}
	w1, b1 := run(3)
	w2, b2 := run(3)
	w3, _ := run(4)
	if !bitsEqual(w1, w2) || !bitsEqual(b1, b2) {
		t.Error("the same seed trained different parameters")
	}
	if bitsEqual(w1, w3) {
		t.Error("different seeds trained the same parameters")
	}
}

func TestTrainerBatches(t *testing.T) {
	cases := []struct {
		name                string
		samples, pick, size uint64
		batch               uint32
		want                []uint32
	}{
		{name: "short last batch", samples: 10, pick: 10, size: 10, batch: 4, want: []uint32{4, 4, 2}},
		{name: "exact batches", samples: 8, pick: 8, size: 8, batch: 4, want: []uint32{4, 4}},
		{name: "smaller than a batch", samples: 10, pick: 10, size: 3, batch: 4, want: []uint32{3}},
		{name: "empty plan", samples: 10, pick: 10, size: 0, batch: 4, want: nil},
		{name: "pick space beyond samples", samples: 5, pick: 12, size: 12, batch: 5, want: []uint32{5, 5, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := small()
			s.Samples, s.BatchSize = c.samples, c.batch
			tr, _ := configure(t, 0, 1, 1, s)
			reps := train(t, tr, plugin.Plan{Seed: 1, PickSpace: c.pick, PartitionSize: c.size})
			var got []uint32
			for _, r := range reps {
				got = append(got, r.Samples)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("batch sizes %v, want %v", got, c.want)
			}
		})
	}
}

func TestTrainerTrainErrors(t *testing.T) {
	errReport := errors.New("host gave up")
	cases := []struct {
		name     string
		mutate   func(*TrainerSettings)
		plan     plugin.Plan
		report   func(n int) error // n: reports so far
		cancelAt int               // cancel the context at this report, 0 = never
		wantErr  string
		wantIs   error
		wantReps int
	}{
		{name: "partition past pick space", plan: plugin.Plan{PickSpace: 10, PartitionOffset: 8, PartitionSize: 3}, wantErr: "does not fit"},
		{name: "partition offset overflows", plan: plugin.Plan{PickSpace: 10, PartitionOffset: math.MaxUint64, PartitionSize: 2}, wantErr: "does not fit"},
		{name: "pick space too big", plan: plugin.Plan{PickSpace: MaxPickSpace + 1, PartitionSize: 1}, wantErr: "limit"},
		{name: "fail after batches", mutate: func(s *TrainerSettings) { s.FailAfterBatches = 3 }, plan: fullEpoch(1, 0, 256), wantErr: "fail_after_batches", wantReps: 3},
		{name: "report error stops", plan: fullEpoch(1, 0, 256), report: func(n int) error {
			if n == 2 {
				return errReport
			}
			return nil
		}, wantIs: errReport, wantReps: 2},
		{name: "cancel between batches", plan: fullEpoch(1, 0, 256), cancelAt: 4, wantIs: context.Canceled, wantReps: 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := small()
			if c.mutate != nil {
				c.mutate(&s)
			}
			tr, _ := configure(t, 0, 1, 1, s)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := 0
			err := tr.Train(ctx, c.plan, func(plugin.BatchReport) error {
				n++
				if n == c.cancelAt {
					cancel()
				}
				if c.report != nil {
					return c.report(n)
				}
				return nil
			})
			if err == nil {
				t.Fatal("Train succeeded")
			}
			if c.wantErr != "" && !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %q does not mention %q", err, c.wantErr)
			}
			if c.wantIs != nil && !errors.Is(err, c.wantIs) {
				t.Errorf("error %v is not %v", err, c.wantIs)
			}
			if n != c.wantReps {
				t.Errorf("%d reports before the error, want %d", n, c.wantReps)
			}
			if _, _, steps, _ := tr.Snapshot(); steps != uint64(c.wantReps) {
				t.Errorf("%d steps taken, want %d", steps, c.wantReps)
			}
		})
	}
	t.Run("fail after batches persists", func(t *testing.T) {
		s := small()
		s.FailAfterBatches = 1
		tr, _ := configure(t, 0, 1, 1, s)
		n := 0
		count := func(plugin.BatchReport) error { n++; return nil }
		err1 := tr.Train(context.Background(), fullEpoch(1, 0, 256), count)
		err2 := tr.Train(context.Background(), fullEpoch(1, 1, 256), count)
		if err1 == nil || err2 == nil || n != 1 {
			t.Fatalf("errors %v, %v after %d reports; want two errors after 1", err1, err2, n)
		}
	})
	t.Run("before Configure", func(t *testing.T) {
		if err := NewTrainer(nil).Train(context.Background(), fullEpoch(1, 0, 8), func(plugin.BatchReport) error { return nil }); err == nil {
			t.Fatal("Train before Configure succeeded")
		}
	})
}

func TestTrainerSleepPerBatch(t *testing.T) {
	s := small()
	s.SleepPerBatch = "20ms"
	s.Samples, s.BatchSize = 3, 1
	tr, _ := configure(t, 0, 1, 1, s)
	reps := train(t, tr, fullEpoch(1, 0, 3))
	for _, r := range reps {
		if r.BatchMS < 20 {
			t.Errorf("batch took %.2f ms with sleep_per_batch 20ms", r.BatchMS)
		}
	}

	// One config file, ranks of unequal speed: rank 1 sleeps, rank 0 not.
	s.SleepPerBatch = "0"
	s.SleepPerBatchByRank = map[string]string{"1": "20ms"}
	slow, _ := configure(t, 1, 2, 1, s)
	for _, r := range train(t, slow, fullEpoch(1, 0, 3)) {
		if r.BatchMS < 20 {
			t.Errorf("rank 1 batch took %.2f ms with its sleep_per_batch_by_rank 20ms", r.BatchMS)
		}
	}
	fast, _ := configure(t, 0, 2, 1, s)
	start := time.Now()
	train(t, fast, fullEpoch(1, 0, 3))
	if d := time.Since(start); d >= 60*time.Millisecond {
		t.Errorf("rank 0 took %v for 3 batches; the by-rank sleep of rank 1 leaked to it", d)
	}
	s.SleepPerBatchByRank = nil

	s.SleepPerBatch = "1h"
	tr, _ = configure(t, 0, 1, 1, s)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	err := tr.Train(ctx, fullEpoch(1, 0, 3), func(plugin.BatchReport) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("Train in a 1h sleep returned %v after %v; want the deadline, promptly", err, time.Since(start))
	}
}

func TestTrainerPublishAdopt(t *testing.T) {
	ctx := context.Background()
	tr, setup := configure(t, 0, 1, 5, small())
	if _, err := tr.Publish(ctx); err == nil {
		t.Fatal("Publish before Attach succeeded")
	}
	a := attach(t, tr, setup)
	reps := train(t, tr, fullEpoch(5, 0, setup.Samples))

	pub, err := tr.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, b, steps, _ := tr.Snapshot()
	if pub.Steps != uint64(len(reps)) || pub.StepCount != steps || steps != uint64(len(reps)) {
		t.Errorf("Publish = %+v, want %d steps of %d", pub, len(reps), steps)
	}
	if math.Abs(pub.ParamNorm-norm(w, b)) > 1e-9 {
		t.Errorf("Publish norm %v, want %v", pub.ParamNorm, norm(w, b))
	}
	aw, ab, am := floats(t, a.Mapping, 0), floats(t, a.Mapping, 1), floats(t, a.Mapping, 2)
	if !bitsEqual(aw, w) || !bitsEqual(ab, b) || !bitsEqual(am, tr.FeatureMean()) {
		t.Fatal("the arena does not hold the published model")
	}
	if slices.Max(am) == 0 && slices.Min(am) == 0 {
		t.Fatal("feature_mean is all zero after training")
	}
	if again, err := tr.Publish(ctx); err != nil || again.Steps != 0 || again.StepCount != steps {
		t.Errorf("second Publish = %+v, %v; want 0 steps since the first", again, err)
	}

	// Another model in the arena; Adopt overwrites or blends.
	other := func(i int, v float32) float32 { return v*-0.5 + float32(i%7)*0.125 }
	set := func() (ow, ob, om []float32) {
		for i := range aw {
			aw[i] = other(i, w[i])
		}
		ab[0] = other(0, b[0])
		fm := tr.FeatureMean()
		for i := range am {
			am[i] = other(i, fm[i]) + 1
		}
		return slices.Clone(aw), slices.Clone(ab), slices.Clone(am)
	}
	blends := []float64{0.25, 0.5, 0, 1}
	for _, alpha := range blends {
		t.Run(fmt.Sprintf("alpha %v", alpha), func(t *testing.T) {
			lw, lb, _, _ := tr.Snapshot()
			lm := tr.FeatureMean()
			ow, ob, om := set()
			n, err := tr.Adopt(ctx, alpha)
			if err != nil {
				t.Fatal(err)
			}
			blend := func(l, g []float32) []float32 {
				out := make([]float32, len(l))
				for i := range l {
					if alpha == 0 || alpha == 1 {
						out[i] = g[i]
					} else {
						out[i] = float32((1-alpha)*float64(l[i]) + alpha*float64(g[i]))
					}
				}
				return out
			}
			gw, gb, _, _ := tr.Snapshot()
			if !bitsEqual(gw, blend(lw, ow)) || !bitsEqual(gb, blend(lb, ob)) || !bitsEqual(tr.FeatureMean(), blend(lm, om)) {
				t.Fatal("Adopt did not give local := (1-a)·local + a·arena (or the arena for 0 and 1)")
			}
			if math.Abs(n-norm(gw, gb)) > 1e-9 {
				t.Errorf("Adopt norm %v, want %v", n, norm(gw, gb))
			}
		})
	}
	for _, alpha := range []float64{-0.1, 1.5, math.NaN()} {
		if _, err := tr.Adopt(ctx, alpha); err == nil {
			t.Errorf("Adopt(%v) succeeded", alpha)
		}
	}

	t.Run("layout mismatch", func(t *testing.T) {
		s := small()
		s.Features++
		_, otherSetup := configure(t, 0, 1, 5, s)
		wrong := newArena(t, otherSetup.Layout)
		if _, err := tr.Attach(ctx, wrong.Descriptor()); err == nil {
			t.Fatal("Attach accepted an arena of another layout")
		}
	})
}

func norm(w, b []float32) float64 {
	var s float64
	for _, v := range append(slices.Clone(w), b...) {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

func TestTrainerCheckpoint(t *testing.T) {
	ctx := context.Background()
	const seed = 9
	tr, setup := configure(t, 0, 1, seed, small())
	train(t, tr, fullEpoch(seed, 0, setup.Samples))
	dir := t.TempDir()
	files, err := tr.SaveCheckpoint(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0] != filepath.Join(dir, CheckpointFile) {
		t.Fatalf("SaveCheckpoint files %v", files)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("checkpoint dir holds %d files, want only the checkpoint", len(ents))
	}
	w, b, steps, trained := tr.Snapshot()
	fm := tr.FeatureMean()

	check := func(t *testing.T, tr *Trainer) {
		t.Helper()
		got, err := tr.LoadCheckpoint(ctx, dir, plugin.LoadResume)
		if err != nil {
			t.Fatal(err)
		}
		gw, gb, gs, gt := tr.Snapshot()
		if got.StepCount != steps || gs != steps || gt != trained || !bitsEqual(gw, w) || !bitsEqual(gb, b) || !bitsEqual(tr.FeatureMean(), fm) {
			t.Fatal("LoadCheckpoint did not restore the saved state bitwise")
		}
	}
	t.Run("same trainer after more training", func(t *testing.T) {
		train(t, tr, fullEpoch(seed, 1, setup.Samples))
		if gw, _, _, _ := tr.Snapshot(); bitsEqual(gw, w) {
			t.Fatal("training changed nothing")
		}
		check(t, tr)
		attach(t, tr, setup)
		if pub, err := tr.Publish(ctx); err != nil || pub.Steps != 0 {
			t.Errorf("Publish after load = %+v, %v; the restored steps count as published", pub, err)
		}
	})
	t.Run("fresh trainer", func(t *testing.T) {
		fresh, _ := configure(t, 1, 2, seed, small())
		check(t, fresh)
	})

	good, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	corrupt := []struct {
		name  string
		bytes func() []byte
		s     func(*TrainerSettings)
	}{
		{name: "truncated", bytes: func() []byte { return good[:len(good)-1] }},
		{name: "empty", bytes: func() []byte { return nil }},
		{name: "flipped bit", bytes: func() []byte { c := slices.Clone(good); c[100] ^= 1; return c }},
		{name: "bad magic", bytes: func() []byte { c := slices.Clone(good); c[0] = 'X'; return c }},
		{name: "other model", bytes: func() []byte { return good }, s: func(s *TrainerSettings) { s.Features *= 2 }},
		{name: "missing"},
	}
	for _, c := range corrupt {
		t.Run("refuses "+c.name, func(t *testing.T) {
			d := t.TempDir()
			if c.bytes != nil {
				if err := os.WriteFile(filepath.Join(d, CheckpointFile), c.bytes(), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s := small()
			if c.s != nil {
				c.s(&s)
			}
			fresh, _ := configure(t, 0, 1, seed, s)
			if _, err := fresh.LoadCheckpoint(ctx, d, plugin.LoadResume); err == nil {
				t.Fatal("LoadCheckpoint succeeded")
			}
			if _, _, steps, _ := fresh.Snapshot(); steps != 0 {
				t.Fatal("a refused checkpoint changed the model")
			}
		})
	}
}

func TestTrainerLedger(t *testing.T) {
	const seed, samples, ranks = 11, 1000, 3
	cases := []struct {
		name   string
		pick   uint64
		epoch  uint64
		copies int
	}{
		{name: "one epoch", pick: samples, epoch: 0, copies: 1},
		{name: "pick space twice the samples", pick: 2 * samples, epoch: 3, copies: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ledger := filepath.Join(t.TempDir(), "ledger")
			s := small()
			s.Samples, s.BatchSize, s.Ledger = samples, 7, ledger
			perm := Permutation(seed, c.epoch, c.pick)
			var wg sync.WaitGroup
			errs := make([]error, ranks)
			wantRank := make(map[uint64][]int) // sample → ranks that own a pick of it
			var off uint64
			for r := range ranks {
				size := c.pick / ranks
				if uint64(r) < c.pick%ranks {
					size++
				}
				for _, p := range perm[off : off+size] {
					wantRank[p%samples] = append(wantRank[p%samples], r)
				}
				tr, _ := configure(t, uint32(r), ranks, seed, s)
				plan := plugin.Plan{Epoch: c.epoch, Seed: seed, PickSpace: c.pick, PartitionOffset: off, PartitionSize: size}
				wg.Go(func() {
					errs[r] = tr.Train(context.Background(), plan, func(plugin.BatchReport) error { return nil })
				})
				off += size
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(ledger)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := make(map[uint64][]int)
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var r int
				var e, i uint64
				if n, err := fmt.Sscanf(sc.Text(), "%d %d %d", &r, &e, &i); n != 3 || err != nil {
					t.Fatalf("ledger line %q: %v", sc.Text(), err)
				}
				if e != c.epoch || i >= samples {
					t.Fatalf("ledger line %q: epoch or index out of range", sc.Text())
				}
				got[i] = append(got[i], r)
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			if len(got) != samples {
				t.Fatalf("ledger names %d samples, want all %d", len(got), samples)
			}
			for i := range uint64(samples) {
				g, w := slices.Sorted(slices.Values(got[i])), slices.Sorted(slices.Values(wantRank[i]))
				if len(g) != c.copies || !slices.Equal(g, w) {
					t.Fatalf("sample %d trained by ranks %v, want %v (%d times)", i, g, w, c.copies)
				}
			}
		})
	}
}

// A plan's LRScale multiplies the step: 0 is 1, 0.5 moves the weights half
// as far in one batch, and a scale that is not a finite positive number is
// refused before training.
func TestTrainerLRScale(t *testing.T) {
	step := func(scale float64) (before, after []float32) {
		tr, setup := configure(t, 0, 1, 3, small())
		before, _, _, _ = tr.Snapshot()
		p := fullEpoch(3, 0, setup.Samples)
		p.PartitionSize, p.LRScale = 16, scale
		train(t, tr, p)
		after, _, _, _ = tr.Snapshot()
		return before, after
	}
	_, one := step(1)
	_, zero := step(0)
	if !bitsEqual(one, zero) {
		t.Error("LRScale 0 trained differently from 1")
	}
	w0, half := step(0.5)
	for j := range w0 {
		full, got := float64(one[j]-w0[j]), float64(half[j]-w0[j])
		if math.Abs(got-full/2) > 1e-6+1e-3*math.Abs(full) {
			t.Fatalf("weight %d moved %g at scale 0.5, %g at 1: want half", j, got, full)
		}
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		tr, setup := configure(t, 0, 1, 3, small())
		p := fullEpoch(3, 0, setup.Samples)
		p.LRScale = bad
		if err := tr.Train(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "learning-rate scale") {
			t.Errorf("LRScale %v: %v, want a refusal naming the learning-rate scale", bad, err)
		}
	}
}

// An Adopt after steps trained since Publish (a round run during training)
// credits them: local + a·(arena − published); with no step since Publish
// it overwrites as before.
func TestTrainerAdoptCreditsStepsSincePublish(t *testing.T) {
	for _, alpha := range []float64{0, 0.5} {
		tr, setup := configure(t, 0, 1, 3, small())
		a := attach(t, tr, setup)
		p := fullEpoch(3, 0, setup.Samples)
		p.PartitionSize = 64
		train(t, tr, p)
		if _, err := tr.Publish(context.Background()); err != nil {
			t.Fatal(err)
		}
		published, _, _, _ := tr.Snapshot()
		p.PartitionOffset = 64
		train(t, tr, p)
		current, _, _, _ := tr.Snapshot()
		// The averager's result: the published weights plus 1 everywhere.
		w := floats(t, a.Mapping, 0)
		for j := range w {
			w[j] = published[j] + 1
		}
		if _, err := tr.Adopt(context.Background(), alpha); err != nil {
			t.Fatal(err)
		}
		got, _, _, _ := tr.Snapshot()
		k := alpha
		if k == 0 {
			k = 1
		}
		for j := range got {
			if want := current[j] + float32(k); math.Abs(float64(got[j]-want)) > 1e-5 {
				t.Fatalf("alpha %g: weight %d is %v, want the trained %v plus %g", alpha, j, got[j], current[j], k)
			}
		}
	}
}

// A batch whose step waited for the trainer's lock (held, as a round's
// Publish or Adopt holds it, while Train runs) reports the wait.
func TestTrainerReportsRoundWait(t *testing.T) {
	tr, setup := configure(t, 0, 1, 3, small())
	p := fullEpoch(3, 0, setup.Samples)
	p.PartitionSize = 32
	var reps []plugin.BatchReport
	err := tr.Train(context.Background(), p, func(r plugin.BatchReport) error {
		reps = append(reps, r)
		if r.Batch == 0 {
			// Between batches: hold the lock for 40 ms, as a Publish
			// that long would.
			locked := make(chan struct{})
			go func() {
				tr.mu.Lock()
				close(locked)
				time.Sleep(40 * time.Millisecond)
				tr.mu.Unlock()
			}()
			<-locked
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].RoundWaitMS > 20 || reps[1].RoundWaitMS < 30 {
		t.Fatalf("reports %+v: want the second batch to have waited about 40 ms, the first not", reps)
	}
}

// With lr_decay the rate follows the schedule's step: a plan's GlobalStep
// sets it, the trainer counts on from there, and every batch reports the
// rate it used.
func TestTrainerLRSchedule(t *testing.T) {
	s := small()
	s.LRDecay = 0.5
	tr, setup := configure(t, 0, 1, 3, s)
	p := fullEpoch(3, 0, setup.Samples)
	p.PartitionSize, p.GlobalStep, p.LRScale = 48, 10, 2
	reps := train(t, tr, p)
	p.Epoch, p.GlobalStep = 1, 0
	reps = append(reps, train(t, tr, p)...)
	for i, r := range reps {
		want := s.LR / (1 + s.LRDecay*float64(10+i)) * 2
		if r.Scalars["lr"] != want {
			t.Errorf("batch %d used lr %v, want %v at schedule step %d", i, r.Scalars["lr"], want, 10+i)
		}
	}
}

// With zero_copy the model lives in the arena: Attach says so, training
// writes the arena without a Publish, Adopt blends in place from the last
// Publish, and Shutdown leaves the model readable.
func TestTrainerZeroCopy(t *testing.T) {
	ctx := context.Background()
	s := small()
	s.ZeroCopy = true
	tr, setup := configure(t, 0, 1, 3, s)
	a := newArena(t, setup.Layout)
	if zc, err := tr.Attach(ctx, a.Descriptor()); err != nil || !zc {
		t.Fatalf("Attach = %v, %v; want zero copy", zc, err)
	}
	m, err := arena.Open(a.Descriptor())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p := fullEpoch(3, 0, setup.Samples)
	p.PartitionSize = 32
	train(t, tr, p)
	w, b, _, _ := tr.Snapshot()
	if !bitsEqual(floats(t, m, entryWeight), w) || !bitsEqual(floats(t, m, entryBias), b) || allZero(w) {
		t.Fatal("training did not write the arena in place")
	}
	if _, err := tr.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	published := slices.Clone(w)
	arenaW := floats(t, m, entryWeight)
	for j := range arenaW {
		arenaW[j] = 1
	}
	if _, err := tr.Adopt(ctx, 0.25); err != nil {
		t.Fatal(err)
	}
	got, _, _, _ := tr.Snapshot()
	for j := range got {
		if want := float32(0.75*float64(published[j]) + 0.25); got[j] != want || arenaW[j] != want {
			t.Fatalf("weight %d after Adopt(0.25): model %v, arena %v; want %v", j, got[j], arenaW[j], want)
		}
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if after, _, _, _ := tr.Snapshot(); !bitsEqual(after, got) {
		t.Error("Shutdown lost the model that lived in the arena")
	}

	// Rounds beside training need the parameters out of the arena.
	over := NewTrainer(nil)
	defer over.Shutdown(ctx)
	if _, err := over.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, Settings: s.JSON(), OverlapRounds: true}); err != nil {
		t.Fatal(err)
	}
	if zc, err := over.Attach(ctx, newArena(t, setup.Layout).Descriptor()); err != nil || zc {
		t.Errorf("Attach with OverlapRounds = %v, %v; want a copy", zc, err)
	}
}

// A replacement's load restores the optimizer's velocity and the counters
// and leaves the model as it is, in the arena or not; a resume restores
// the model too.
func TestTrainerLoadReplacement(t *testing.T) {
	ctx := context.Background()
	for _, zeroCopy := range []bool{false, true} {
		t.Run(fmt.Sprintf("zero copy %v", zeroCopy), func(t *testing.T) {
			s := small()
			s.Momentum, s.ZeroCopy = 0.9, zeroCopy
			tr, setup := configure(t, 0, 1, 3, s)
			a := newArena(t, setup.Layout)
			if _, err := tr.Attach(ctx, a.Descriptor()); err != nil {
				t.Fatal(err)
			}
			train(t, tr, fullEpoch(3, 0, setup.Samples))
			dir := t.TempDir()
			if _, err := tr.SaveCheckpoint(ctx, dir); err != nil {
				t.Fatal(err)
			}
			saved, _, steps, _ := tr.Snapshot()
			train(t, tr, fullEpoch(3, 1, setup.Samples))
			newer, _, _, _ := tr.Snapshot()
			before := slices.Clone(a.Bytes())

			res, err := tr.LoadCheckpoint(ctx, dir, plugin.LoadReplacement)
			if err != nil || res != (plugin.LoadResult{StepCount: steps}) {
				t.Fatalf("LoadCheckpoint(replacement) = %+v, %v; want step count %d", res, err, steps)
			}
			if got, _, gs, _ := tr.Snapshot(); !bitsEqual(got, newer) || gs != steps || !slices.Equal(a.Bytes(), before) {
				t.Fatalf("a replacement's load changed the model or the arena, or restored %d steps, not %d", gs, steps)
			}
			if _, err := tr.LoadCheckpoint(ctx, dir, plugin.LoadResume); err != nil {
				t.Fatal(err)
			}
			if got, _, _, _ := tr.Snapshot(); !bitsEqual(got, saved) {
				t.Fatal("a resume did not restore the model")
			}
		})
	}
}

func allZero(v []float32) bool {
	return !slices.ContainsFunc(v, func(x float32) bool { return x != 0 })
}
