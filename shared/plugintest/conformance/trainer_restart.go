package conformance

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The checks of what survives a trainer's end: a checkpoint restored to
// resume a run, and a trainer lost mid-run and replaced.

// save writes x's checkpoint into a fresh directory and checks the files
// SaveCheckpoint returns.
func (x *trainee) save() string {
	x.t.Helper()
	dir := x.t.TempDir()
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	files, err := x.tr.SaveCheckpoint(ctx, dir)
	if err != nil {
		x.t.Fatalf("SaveCheckpoint must succeed after training: %v", err)
	}
	if len(files) == 0 {
		x.t.Errorf("SaveCheckpoint must return the files it wrote: it returned none")
	}
	for _, f := range files {
		if !filepath.IsAbs(f) {
			f = filepath.Join(dir, f)
		}
		if _, err := os.Stat(f); err != nil {
			x.t.Errorf("SaveCheckpoint must return the files it wrote: %v", err)
		}
	}
	return dir
}

func (x *trainee) load(dir string, reason plugin.LoadReason) plugin.LoadResult {
	x.t.Helper()
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	res, err := x.tr.LoadCheckpoint(ctx, dir, reason)
	if err != nil {
		x.t.Fatalf("LoadCheckpoint(%v) must restore what SaveCheckpoint wrote: %v", reason, err)
	}
	return res
}

func (x *trainee) evaluateLoss() float64 {
	x.t.Helper()
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	r, err := x.tr.Evaluate(ctx)
	if err != nil {
		x.t.Fatalf("Evaluate must succeed after training: %v", err)
	}
	return r.Loss
}

// nextPlan is the plan the checks train after a checkpoint: epoch 1's
// first 3½ batches.
func (x *trainee) nextPlan() plugin.Plan {
	p := x.plan()
	p.Epoch = 1
	return p
}

// where names the element at 4-byte word k of an arena of layout.
func where(layout arena.Layout, k int) string {
	for _, e := range layout.Entries {
		if lo := int(e.Offset / 4); k >= lo && k < lo+int(e.Bytes/4) {
			return fmt.Sprintf("%q[%d]", e.Name, k-lo)
		}
	}
	return fmt.Sprintf("word %d", k)
}

// checkpoint: LoadCheckpoint(LoadResume) into a fresh trainer restores
// what SaveCheckpoint saved, the parameters and the step count, and all
// the next step depends on (the optimizer's state, the schedule's step):
// the next plan trains the restored trainer as it trains the saved one,
// bit for bit, reports included.
func (s *trainerSuite) checkpoint(t T) {
	x := s.start(t)
	x.train(x.plan())
	pub := x.publish()
	want := slices.Clone(x.arena.Bytes())
	dir := x.save()
	evalWant := x.evaluateLoss()
	next := x.nextPlan()
	kept := x.train(next)
	x.publish()
	keptWent := slices.Clone(x.arena.Bytes())

	y := s.start(t)
	if res := y.load(dir, plugin.LoadResume); res.StepCount != pub.StepCount {
		t.Errorf("LoadCheckpoint must return the step count it restored: %d, the saved trainer had %d", res.StepCount, pub.StepCount)
	}
	y.clobber()
	if again := y.publish(); again.Steps != 0 {
		t.Errorf("LoadCheckpoint's restored steps must count as published: the first Publish after it reported %d steps", again.Steps)
	}
	if k := diffAt(want, y.arena.Bytes()); k >= 0 {
		t.Errorf("LoadCheckpoint must restore the parameters bit for bit: after it, Publish wrote other bytes than the saved trainer's (first at 4-byte word %d)", k)
		return
	}
	if got := y.evaluateLoss(); got != evalWant {
		t.Errorf("a restored model must evaluate as the saved one did: loss %v, the saved trainer's %v", got, evalWant)
	}
	restored := y.train(next)
	y.publish()
	for i := range min(len(kept), len(restored)) {
		k, r := kept[i], restored[i]
		if k.StepCount != r.StepCount || math.Float64bits(k.Loss) != math.Float64bits(r.Loss) {
			t.Errorf("a checkpoint and its restore must give the same next step, bit for bit: in the next plan the restored trainer's batch %d reports step count %d and loss %v, the saved trainer's %d and %v (a step count, the schedule's step or the optimizer's state restored off?)",
				i, r.StepCount, r.Loss, k.StepCount, k.Loss)
			return
		}
	}
	if k := diffAt(keptWent, y.arena.Bytes()); k >= 0 {
		// Tell a restore that lost something from steps that never repeat.
		z := s.start(t)
		z.train(z.plan())
		z.publish()
		z.train(next)
		z.publish()
		if !bytes.Equal(z.arena.Bytes(), keptWent) {
			t.Logf("two trainers configured alike trained the same plans to different values: the next step after a restore is not checked")
			return
		}
		t.Errorf("a checkpoint and its restore must give the same next step, bit for bit: after the next plan, %s is %v on the restored trainer and %v on the saved one (the optimizer's state or the schedule's step restored off?)",
			where(y.setup.Layout, k), f32(y.arena.Bytes(), k), f32(keptWent, k))
	}
}

// replacement: a trainer lost mid-run is replaced by a fresh one,
// configured and attached as the first to the same arena, into which the
// core puts its values back after Attach (a trainer that trains in the
// arena writes its fresh model there). LoadCheckpoint(LoadReplacement)
// with the rank's last checkpoint must leave the arena as it is, and the
// Adopt(0) that follows make the model the arena's values, newer than the
// checkpoint's: the model must not go back. The optimizer's state and the
// counters come from the checkpoint, so the next plan trains the new
// trainer as it trains one that resumed from the checkpoint and was set to
// the arena's values. A trainer that cannot use the arena's values says so
// (LoadResult.CheckpointParams) and must then hold the checkpoint's.
func (s *trainerSuite) replacement(t T) {
	x := s.start(t)
	x.train(x.plan())
	saved := x.publish()
	ckpt := slices.Clone(x.arena.Bytes())
	dir := x.save()
	x.train(x.nextPlan())
	x.publish()
	newer := slices.Clone(x.arena.Bytes())
	if bytes.Equal(newer, ckpt) {
		t.Fatalf("Train must change the parameters: a plan after the checkpoint left the arena as the checkpoint's")
	}
	// x is lost: the suite calls it no more.

	y := &trainee{t: t, tr: s.make(t), arena: x.arena}
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	var err error
	if y.setup, err = y.tr.Configure(ctx, s.config(s.o.settings)); err != nil {
		t.Fatalf("Configure must accept the settings %s: %v", s.o.settings, err)
	}
	if y.zeroCopy, err = y.tr.Attach(ctx, x.arena.Descriptor()); err != nil {
		t.Fatalf("Attach must accept an arena of the layout Configure returned: %v", err)
	}
	copy(y.arena.Bytes(), newer)
	res := y.load(dir, plugin.LoadReplacement)
	if res.StepCount != saved.StepCount {
		t.Errorf("LoadCheckpoint(LoadReplacement) must return the step count it restored: %d, the checkpoint's is %d", res.StepCount, saved.StepCount)
	}
	layout := y.setup.Layout
	if res.CheckpointParams {
		t.Logf("LoadCheckpoint(LoadReplacement) says the trainer cannot use the arena's parameters (LoadResult.CheckpointParams): it holds the checkpoint's")
		y.clobber()
		y.publish()
		if k := diffAt(ckpt, y.arena.Bytes()); k >= 0 {
			t.Errorf("a trainer whose LoadCheckpoint(LoadReplacement) says CheckpointParams must hold the checkpoint's parameters: after it, Publish wrote %v at %s, the checkpoint holds %v",
				f32(y.arena.Bytes(), k), where(layout, k), f32(ckpt, k))
		}
		return
	}
	back := func(k int) string {
		if f32(y.arena.Bytes(), k) == f32(ckpt, k) && f32(ckpt, k) != f32(newer, k) {
			return ", the checkpoint's value: the model went back"
		}
		return ""
	}
	if k := diffAt(newer, y.arena.Bytes()); k >= 0 {
		t.Errorf("LoadCheckpoint(LoadReplacement) must leave the arena as it is, since it holds parameters newer than the checkpoint's: it changed %s from %v to %v%s",
			where(layout, k), f32(newer, k), f32(y.arena.Bytes(), k), back(k))
		return
	}
	if err := y.adoptErr(0); err != nil {
		t.Fatalf("Adopt(0) must succeed after LoadCheckpoint: %v", err)
	}
	y.clobber()
	pub := y.publish()
	if k := diffAt(newer, y.arena.Bytes()); k >= 0 {
		t.Errorf("after a replacement's LoadCheckpoint(LoadReplacement) and Adopt(0), the model must hold the arena's values, newer than the checkpoint's: Publish wrote %v at %s, the arena held %v%s",
			f32(y.arena.Bytes(), k), where(layout, k), f32(newer, k), back(k))
		return
	}
	if pub.StepCount != saved.StepCount || pub.Steps != 0 {
		t.Errorf("after LoadCheckpoint(LoadReplacement) the step count must be the checkpoint's, all published: Publish reported step count %d and %d steps, want %d and 0",
			pub.StepCount, pub.Steps, saved.StepCount)
	}

	// The optimizer's state is the checkpoint's: as a trainer resumed from
	// it and set to the arena's values.
	next := y.plan()
	next.Epoch = 2
	y.train(next)
	y.publish()
	ref := func() []byte {
		z := s.start(t)
		z.load(dir, plugin.LoadResume)
		copy(z.arena.Bytes(), newer)
		if err := z.adoptErr(0); err != nil {
			t.Fatalf("Adopt(0) must succeed after LoadCheckpoint: %v", err)
		}
		z.train(next)
		z.publish()
		return slices.Clone(z.arena.Bytes())
	}
	want := ref()
	if k := diffAt(want, y.arena.Bytes()); k >= 0 {
		if !bytes.Equal(ref(), want) {
			t.Logf("two trainers restored alike trained the same plan to different values: the optimizer's state after a replacement is not checked")
			return
		}
		t.Errorf("after LoadCheckpoint(LoadReplacement) the optimizer's state and counters must be the checkpoint's: the next plan trained %s to %v, a trainer resumed from the checkpoint and set to the arena's values to %v",
			where(layout, k), f32(y.arena.Bytes(), k), f32(want, k))
	}
}
