package main

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// The Python trainer's parameters are views of the arena: what the host
// writes there is what the model computes with, with no Adopt between,
// what it trains lands there with no Publish, and Publish reports no bytes
// copied.
func TestParametersLiveInTheArena(t *testing.T) {
	file, err := filepath.Abs("testdata/small.py")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := conformance.TrainerBinary(buildPlugin(t))(conformance.Testing(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, LocalRanks: 1, Seed: 3, Settings: settings(t, map[string]any{"file": file})})
	if err != nil {
		t.Fatal(err)
	}
	a, err := arena.Create(t.TempDir(), "pytorch-test", setup.Layout)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Remove()
	zeroCopy, err := tr.Attach(ctx, a.Descriptor())
	if err != nil || !zeroCopy {
		t.Fatalf("Attach: zero copy %v, %v; want a model on the CPU viewed in place", zeroCopy, err)
	}

	// Zero weights make every logit 0: cross-entropy over 4 classes is
	// ln 4, whatever the data, if and only if the model reads the arena.
	clear(a.Bytes())
	res, err := tr.Evaluate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(res.Loss-math.Log(4)) > 1e-6 {
		t.Errorf("after the arena was zeroed the model evaluates to loss %v, want ln 4 = %v: its tensors are not the arena's", res.Loss, math.Log(4))
	}

	// Training moves the arena itself.
	before := slices.Clone(a.Bytes())
	p := plugin.Plan{PartitionSize: 64, Seed: 3, PickSpace: setup.Samples}
	if err := tr.Train(ctx, p, func(plugin.BatchReport) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(before, a.Bytes()) {
		t.Errorf("two steps of training left the arena as it was: the optimizer does not update it in place")
	}
	pub, err := tr.Publish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pub.HostCopyBytes != 0 || pub.Steps != 2 {
		t.Errorf("Publish: %d bytes copied and %d steps, want 0 bytes (the model is the arena) and 2 steps", pub.HostCopyBytes, pub.Steps)
	}
}

// trainOnce attaches tr to a fresh arena and trains one batch.
func trainOnce(ctx context.Context, t *testing.T, tr plugin.Trainer, setup plugin.TrainerSetup) error {
	t.Helper()
	a, err := arena.Create(t.TempDir(), "pytorch-test", setup.Layout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Remove() })
	if _, err := tr.Attach(ctx, a.Descriptor()); err != nil {
		t.Fatal(err)
	}
	p := plugin.Plan{PartitionSize: uint64(setup.BatchSize), Seed: 1, PickSpace: setup.Samples}
	return tr.Train(ctx, p, func(plugin.BatchReport) error { return nil })
}

// Buffers live in the arena too, of their own dtypes (batch norm's f32
// statistics and its i64 step counter, an f64 parameter), and a weight
// that was not contiguous becomes a view of its entry: training moves
// every one of them in the arena itself, with no Publish.
func TestBuffersAndOtherDTypesInTheArena(t *testing.T) {
	file, err := filepath.Abs("testdata/buffers.py")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := conformance.TrainerBinary(buildPlugin(t))(conformance.Testing(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, LocalRanks: 1, Seed: 5, Settings: settings(t, map[string]any{"file": file})})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		dtype arena.DType
		role  arena.Role
		shape []int64
	}{
		"w": {arena.F32, arena.Parameter, []int64{8, 4}}, "shift": {arena.F64, arena.Parameter, []int64{4}},
		"norm.weight": {arena.F32, arena.Parameter, []int64{8}}, "norm.running_mean": {arena.F32, arena.Buffer, []int64{8}},
		"norm.num_batches_tracked": {arena.I64, arena.Buffer, []int64{}},
	}
	for name, w := range want {
		i := setup.Layout.Index(name)
		if i < 0 {
			t.Fatalf("the layout has no %q: %+v", name, setup.Layout.Entries)
		}
		e := setup.Layout.Entries[i]
		if e.DType != w.dtype || e.Role != w.role || !slices.Equal(e.Shape, w.shape) {
			t.Errorf("%q: %v %v %v, want %v %v %v", name, e.DType, e.Role, e.Shape, w.dtype, w.role, w.shape)
		}
	}
	a, err := arena.Create(t.TempDir(), "pytorch-test", setup.Layout)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Remove()
	if zc, err := tr.Attach(ctx, a.Descriptor()); err != nil || !zc {
		t.Fatalf("Attach: zero copy %v, %v", zc, err)
	}
	before := slices.Clone(a.Bytes())
	if err := tr.Train(ctx, plugin.Plan{PartitionSize: 48, Seed: 5, PickSpace: setup.Samples}, func(plugin.BatchReport) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for name := range want {
		e := setup.Layout.Entries[setup.Layout.Index(name)]
		if slices.Equal(before[e.Offset:e.Offset+e.Bytes], a.Bytes()[e.Offset:e.Offset+e.Bytes]) {
			t.Errorf("three steps left %q as it was in the arena: not trained in place", name)
		}
	}
	e := setup.Layout.Entries[setup.Layout.Index("norm.num_batches_tracked")]
	if n := binary.LittleEndian.Uint64(a.Bytes()[e.Offset:]); n != 3 {
		t.Errorf("the arena's num_batches_tracked is %d after 3 batches, want 3", n)
	}
}

// Configure says whether the user's optimizer is one of torch's adaptive
// ones, which the coordinator's default divergence target follows.
func TestAdaptiveOptimizerReported(t *testing.T) {
	file, err := filepath.Abs("testdata/small.py")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		optimizer string
		want      bool
	}{{"sgd", false}, {"adamw", true}} {
		tr, err := conformance.TrainerBinary(buildPlugin(t))(conformance.Testing(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, LocalRanks: 1, Seed: 3,
			Settings: settings(t, map[string]any{"file": file, "args": map[string]any{"optimizer": tc.optimizer}})})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", tc.optimizer, err)
		}
		if setup.AdaptiveOptimizer != tc.want {
			t.Errorf("%s: Configure says adaptive optimizer %v, want %v", tc.optimizer, setup.AdaptiveOptimizer, tc.want)
		}
	}
}
