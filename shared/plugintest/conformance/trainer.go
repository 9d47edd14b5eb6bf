package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// RunTrainer checks every promise of plugin.Trainer on the trainers f
// makes, each promise a subtest of t, configured with TrainerSettings: as
// rank 0 of a world of 1, and as every rank of a world of TrainerWorld
// where a promise concerns the ranks.
func RunTrainer(t *testing.T, f TrainerFactory, opts ...TrainerOption) {
	t.Helper()
	CheckTrainer(Testing(t), f, opts...)
}

// CheckTrainer is RunTrainer on any T.
func CheckTrainer(t T, f TrainerFactory, opts ...TrainerOption) {
	t.Helper()
	o := trainerOptions{world: 2}
	for _, opt := range opts {
		opt(&o)
	}
	s := &trainerSuite{f: f, o: o}
	t.Run("Describe", s.describe)
	if !t.Run("Configure", s.configureCheck) {
		return // every other check needs a configured trainer
	}
	t.Run("BadSettings", s.badSettings)
	t.Run("TrainAndPublish", s.trainAndPublish)
	t.Run("ReportError", s.reportError)
	t.Run("Picks", s.picks)
	t.Run("LRScale", s.lrScale)
	t.Run("Adopt", s.adopt)
	t.Run("TrainsDuringRounds", s.trainsDuringRounds)
	t.Run("Checkpoint", s.checkpoint)
	t.Run("Replacement", s.replacement)
	t.Run("Evaluate", s.evaluate)
	t.Run("Shutdown", s.shutdown)
}

type trainerSuite struct {
	f TrainerFactory
	o trainerOptions
}

// trainee is one trainer under test, configured and attached.
type trainee struct {
	t        T
	tr       plugin.Trainer
	setup    plugin.TrainerSetup
	arena    *arena.Owned
	zeroCopy bool
}

func (s *trainerSuite) make(t T) plugin.Trainer {
	t.Helper()
	tr, err := s.f(t)
	if err != nil {
		t.Fatalf("the factory could not make a trainer: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := callCtx(CallBound)
		defer cancel()
		tr.Shutdown(ctx)
	})
	return tr
}

func (s *trainerSuite) config(settings json.RawMessage) plugin.TrainerConfig {
	return plugin.TrainerConfig{Rank: 0, WorldSize: 1, LocalRanks: 1, Seed: 7, Settings: settings}
}

// start makes, configures and attaches a trainer.
func (s *trainerSuite) start(t T) *trainee {
	return s.startWith(t, s.config(s.o.settings))
}

// startWith is start with cfg.
func (s *trainerSuite) startWith(t T, cfg plugin.TrainerConfig) *trainee {
	t.Helper()
	x := &trainee{t: t, tr: s.make(t)}
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	var err error
	if x.setup, err = x.tr.Configure(ctx, cfg); err != nil {
		t.Fatalf("Configure must accept the settings %s: %v", s.o.settings, err)
	}
	if x.arena, err = arena.Create(t.TempDir(), "conformance-trainer", x.setup.Layout); err != nil {
		t.Fatalf("an arena of the layout Configure returned: %v", err)
	}
	t.Cleanup(func() { x.arena.Remove() })
	if x.zeroCopy, err = x.tr.Attach(ctx, x.arena.Descriptor()); err != nil {
		t.Fatalf("Attach must accept an arena of the layout Configure returned: %v", err)
	}
	return x
}

func (s *trainerSuite) describe(t T) {
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	d, err := s.make(t).Describe(ctx)
	if err != nil {
		t.Fatalf("Describe must succeed before Configure: %v", err)
	}
	if d.Name == "" || d.Version == "" {
		t.Errorf("Describe must return a non-empty Name and Version: got name %q, version %q", d.Name, d.Version)
	}
}

func (s *trainerSuite) configureCheck(t T) {
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	setup, err := s.make(t).Configure(ctx, s.config(s.o.settings))
	if err != nil {
		t.Fatalf("Configure must accept the settings %s: %v", s.o.settings, err)
	}
	l := setup.Layout
	if err := l.Validate(); err != nil {
		t.Errorf("Configure must return a valid layout: %v", err)
	}
	if len(l.Entries) == 0 {
		t.Errorf("Configure must return a layout with at least one tensor")
	}
	if packed, err := arena.Pack(l.Entries); err == nil && packed.Digest() != l.Digest() {
		t.Errorf("Configure's layout must be packed by arena.Pack: its offsets or size differ from Pack's (size %d, Pack's %d)", l.Size, packed.Size)
	}
	if setup.Samples == 0 || setup.BatchSize == 0 {
		t.Errorf("Configure must return Samples and BatchSize above 0: got %d samples, batch size %d", setup.Samples, setup.BatchSize)
	}
}

func (s *trainerSuite) badSettings(t T) {
	bad := append([]json.RawMessage{[]byte(`{"conformance_no_such_setting": 1}`), []byte(`[1, 2]`)}, s.o.bad...)
	for _, raw := range bad {
		ctx, cancel := callCtx(CallBound)
		_, err := s.make(t).Configure(ctx, s.config(raw))
		cancel()
		if err == nil {
			t.Errorf("Configure must refuse bad settings with an error: it accepted %s", raw)
		}
	}
}

// plan is 3½ batches of epoch 0 (the whole data set when smaller).
func (x *trainee) plan() plugin.Plan {
	b := uint64(x.setup.BatchSize)
	return plugin.Plan{PartitionSize: min(x.setup.Samples, 3*b+max(b/2, 1)), Seed: 7, PickSpace: x.setup.Samples}
}

// train runs p and returns its reports.
func (x *trainee) train(p plugin.Plan) []plugin.BatchReport {
	x.t.Helper()
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	var reps []plugin.BatchReport
	if err := x.tr.Train(ctx, p, func(r plugin.BatchReport) error { reps = append(reps, r); return nil }); err != nil {
		x.t.Fatalf("Train must run plan %+v: %v", p, err)
	}
	return reps
}

func (x *trainee) publish() plugin.PublishResult {
	x.t.Helper()
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	res, err := x.tr.Publish(ctx)
	if err != nil {
		x.t.Fatalf("Publish must succeed after Attach: %v", err)
	}
	return res
}

// clobber overwrites the arena, unless the model lives in it.
func (x *trainee) clobber() {
	if !x.zeroCopy {
		clear(x.arena.Bytes())
	}
}

func (s *trainerSuite) trainAndPublish(t T) {
	x := s.start(t)
	p := x.plan()
	reps := x.train(p)
	b := uint64(x.setup.BatchSize)
	if n := (p.PartitionSize + b - 1) / b; uint64(len(reps)) != n {
		t.Errorf("Train must report once per batch: a plan of %d samples in batches of %d made %d reports, want %d", p.PartitionSize, b, len(reps), n)
	}
	var samples uint64
	scalars := map[string]bool{}
	for i, r := range reps {
		samples += uint64(r.Samples)
		if r.Batch != uint64(i) {
			t.Errorf("BatchReport.Batch must count the plan's batches from 0: report %d says %d", i, r.Batch)
		}
		if math.IsNaN(r.Loss) || math.IsInf(r.Loss, 0) {
			t.Errorf("BatchReport.Loss must be finite: batch %d says %v", i, r.Loss)
		}
		for name := range r.Scalars {
			if !scalars[name] && !plugin.ValidScalarName(name) {
				t.Errorf("BatchReport.Scalars names must pass plugin.ValidScalarName (the host drops others): batch %d reports %q", i, name)
			}
			scalars[name] = true
		}
	}
	if len(scalars) > plugin.MaxScalars {
		t.Errorf("a plan's reports must name at most plugin.MaxScalars (%d) scalars (the host drops the rest): they name %d", plugin.MaxScalars, len(scalars))
	}
	if samples != p.PartitionSize {
		t.Errorf("Train's reports must count every sample of the plan once: their samples sum to %d, the partition holds %d", samples, p.PartitionSize)
	}
	first := x.publish()
	if first.Steps == 0 {
		t.Errorf("Publish must report the steps since the last Publish: 0 after %d batches", len(reps))
	}
	if len(reps) > 0 && first.StepCount != reps[len(reps)-1].StepCount {
		t.Errorf("Publish's StepCount must be the last batch's: %d, the last report said %d", first.StepCount, reps[len(reps)-1].StepCount)
	}
	published := append([]byte(nil), x.arena.Bytes()...)
	x.clobber()
	if again := x.publish(); again.Steps != 0 {
		t.Errorf("Publish must report the steps since the last Publish: %d with no training since", again.Steps)
	}
	if k := diffAt(published, x.arena.Bytes()); k >= 0 {
		t.Errorf("Publish must write the model's parameters into the arena: a second Publish with no training between wrote other bytes (first at 4-byte word %d)", k)
	}
}

func (s *trainerSuite) reportError(t T) {
	x := s.start(t)
	p := x.plan()
	if p.PartitionSize <= uint64(x.setup.BatchSize) {
		t.Logf("the data set holds one batch: nothing to check")
		return
	}
	stop := errors.New("conformance suite: report refuses")
	calls := 0
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	err := x.tr.Train(ctx, p, func(plugin.BatchReport) error { calls++; return stop })
	if err == nil || !strings.Contains(err.Error(), stop.Error()) {
		t.Errorf("Train must return report's error when report fails: got %v", err)
	}
	if calls != 1 {
		t.Errorf("Train must stop when report fails: report was called %d times after failing once", calls-1)
	}
}

// fillParams writes known values into every f32 entry, drawn from seed.
func (x *trainee) fillParams(seed int) {
	for i, e := range x.setup.Layout.Entries {
		if e.DType != arena.F32 {
			continue
		}
		b, _ := x.arena.Tensor(i)
		v := arena.AsFloat32s(b)
		for k := range v {
			v[k] = float32(0.05 * math.Sin(float64(seed*7919+i*17+k)))
		}
	}
}

func (x *trainee) adoptErr(alpha float64) error {
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	_, err := x.tr.Adopt(ctx, alpha)
	return err
}

func (s *trainerSuite) adopt(t T) {
	x := s.start(t)
	x.train(x.plan())
	x.publish()
	x.fillParams(1)
	known := append([]byte(nil), x.arena.Bytes()...)
	if err := x.adoptErr(0); err != nil {
		t.Fatalf("Adopt(0) must succeed: %v", err)
	}
	x.clobber()
	x.publish()
	for i, e := range x.setup.Layout.Entries {
		b, _ := x.arena.Tensor(i)
		want := known[e.Offset : e.Offset+e.Bytes]
		if k := diffAt(want, b); k >= 0 && e.DType == arena.F32 {
			t.Errorf("Adopt(0) must make the model use the arena's values: after Adopt and Publish, %q[%d] is %v, the arena held %v", e.Name, k, f32(b, k), f32(want, k))
			break
		}
	}

	// A blend: local (the last Publish, known) towards the arena.
	const a = 0.25
	x.fillParams(2)
	other := append([]byte(nil), x.arena.Bytes()...)
	if err := x.adoptErr(a); err != nil {
		t.Fatalf("Adopt(%v) must succeed: %v", a, err)
	}
	x.clobber()
	x.publish()
	for i, e := range x.setup.Layout.Entries {
		if e.DType != arena.F32 || e.Role != arena.Parameter {
			continue
		}
		b, _ := x.arena.Tensor(i)
		for k := 0; k < int(e.Bytes/4); k++ {
			l, g := float64(f32(known[e.Offset:], k)), float64(f32(other[e.Offset:], k))
			want := (1-a)*l + a*g
			if got := float64(f32(b, k)); !(math.Abs(got-want) <= Tolerance*math.Max(math.Abs(l)+math.Abs(g), 1e-6)) {
				t.Errorf("Adopt(%v) must blend (1-a)·local + a·arena, local being the values at the last Publish: %q[%d] is %v, want %v (local %v, arena %v)",
					a, e.Name, k, got, want, l, g)
				return
			}
		}
	}
	for _, bad := range []float64{-0.5, 1.5, math.NaN()} {
		if err := x.adoptErr(bad); err == nil {
			t.Errorf("Adopt must refuse a blendAlpha outside [0, 1] with an error: it accepted %v", bad)
		}
	}
}

// trainsDuringRounds holds a trainer that declares
// plugin.CapTrainsDuringRounds to that promise. Configured with
// OverlapRounds it keeps its parameters out of the arena (the averager
// works on it while Train runs), takes Publish and Adopt while Train runs,
// and an Adopt after steps trained since Publish keeps them: the model
// becomes current + (arena − published). The exact values are checked
// where two trainers configured alike train alike; otherwise only that
// the steps were kept.
func (s *trainerSuite) trainsDuringRounds(t T) {
	ctx, cancel := callCtx(CallBound)
	d, err := s.make(t).Describe(ctx)
	cancel()
	if err != nil {
		t.Fatalf("Describe must succeed before Configure: %v", err)
	}
	if !slices.Contains(d.Capabilities, plugin.CapTrainsDuringRounds) {
		t.Logf("Describe does not declare %q: nothing to check", plugin.CapTrainsDuringRounds)
		return
	}
	cfg := s.config(s.o.settings)
	cfg.OverlapRounds = true
	x, y := s.startWith(t, cfg), s.startWith(t, cfg)
	if x.zeroCopy {
		t.Fatalf("a trainer declaring %q, configured with OverlapRounds, must keep its parameters out of the arena: Attach said zero-copy", plugin.CapTrainsDuringRounds)
	}
	p1 := x.plan()
	p2 := p1
	p2.Epoch = 1
	for _, z := range []*trainee{x, y} {
		z.train(p1)
		z.publish()
	}
	published := append([]byte(nil), y.arena.Bytes()...)
	alike := diffAt(published, x.arena.Bytes()) < 0
	for _, z := range []*trainee{x, y} {
		z.train(p2)
	}
	// x's current values, by a Publish; y adopts published + δ.
	x.publish()
	current := x.arena.Bytes()
	shifted := append([]byte(nil), published...)
	params := 0
	for i, e := range y.setup.Layout.Entries {
		if e.DType != arena.F32 || e.Role != arena.Parameter {
			continue
		}
		params++
		v := arena.AsFloat32s(shifted[e.Offset : e.Offset+e.Bytes])
		for k := range v {
			v[k] += delta(i, k)
		}
	}
	if params == 0 {
		t.Logf("the layout has no f32 parameters: nothing to check")
		return
	}
	copy(y.arena.Bytes(), shifted)
	if err := y.adoptErr(0); err != nil {
		t.Fatalf("Adopt(0) must succeed after steps trained since Publish: %v", err)
	}
	y.publish()
	got := y.arena.Bytes()
	kept := false
	for i, e := range y.setup.Layout.Entries {
		if e.DType != arena.F32 || e.Role != arena.Parameter {
			continue
		}
		for k := 0; k < int(e.Bytes/4); k++ {
			g, sh := float64(f32(got[e.Offset:], k)), float64(f32(shifted[e.Offset:], k))
			if g != sh {
				kept = true
			}
			if !alike {
				continue
			}
			c, dk := float64(f32(current[e.Offset:], k)), float64(delta(i, k))
			if want := c + dk; !(math.Abs(g-want) <= Tolerance*math.Max(math.Abs(c)+math.Abs(dk), 1e-6)) {
				t.Errorf("Adopt after steps trained since Publish must credit them, current + (arena − published): %q[%d] is %v, want %v (current %v, the arena moved by %v)",
					e.Name, k, g, want, c, dk)
				return
			}
		}
	}
	if !kept {
		t.Errorf("Adopt after steps trained since Publish must keep those steps: the model became the arena's values exactly (an overwrite)")
	}
	if !alike {
		t.Logf("two trainers configured alike trained to different values: only checked that Adopt kept the steps")
	}

	// Publish and Adopt while Train runs, from its first report, as the
	// host calls them between batches: neither may fail or block, and
	// Train must finish its plan.
	z := s.startWith(t, cfg)
	z.train(p1)
	z.publish()
	tctx, tcancel := callCtx(CallBound)
	defer tcancel()
	var reps []plugin.BatchReport
	var during error
	done := make(chan error, 1)
	go func() {
		done <- z.tr.Train(tctx, p2, func(r plugin.BatchReport) error {
			if len(reps) == 0 {
				during = publishAdopt(tctx, z.tr)
			}
			reps = append(reps, r)
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Train must finish its plan when Publish and Adopt run during it: %v", err)
		}
	case <-time.After(CallBound + time.Second):
		t.Fatalf("Train did not return within %v when Publish and Adopt ran during it (a lock held across the report?)", CallBound)
	}
	if during != nil {
		t.Errorf("Publish and Adopt must succeed while Train runs: %v", during)
	}
	for i, r := range reps {
		if math.IsNaN(r.RoundWaitMS) || math.IsInf(r.RoundWaitMS, 0) || r.RoundWaitMS < 0 {
			t.Errorf("BatchReport.RoundWaitMS must be a finite duration of at least 0: batch %d says %v", i, r.RoundWaitMS)
			break
		}
	}
}

// publishAdopt publishes and adopts (an overwrite) on tr, as a round
// beside training does.
func publishAdopt(ctx context.Context, tr plugin.Trainer) error {
	if _, err := tr.Publish(ctx); err != nil {
		return fmt.Errorf("Publish: %w", err)
	}
	if _, err := tr.Adopt(ctx, 0); err != nil {
		return fmt.Errorf("Adopt: %w", err)
	}
	return nil
}

// delta is what trainsDuringRounds moves the arena's entry i, element k, by.
func delta(i, k int) float32 { return float32(0.01 * math.Cos(float64(i*31+k))) }

func (s *trainerSuite) evaluate(t T) {
	x := s.start(t)
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	res, err := x.tr.Evaluate(ctx)
	if err != nil {
		t.Fatalf("Evaluate must succeed after Configure: %v", err)
	}
	if math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0) {
		t.Errorf("Evaluate must return a finite loss: got %v", res.Loss)
	}
	if res.Samples == 0 {
		t.Errorf("Evaluate must say how many samples it evaluated: got 0")
	}
	if a := res.Accuracy; a != nil && !(*a >= 0 && *a <= 1) {
		t.Errorf("Evaluate's Accuracy must lie in [0, 1]: got %v", *a)
	}
}

func (s *trainerSuite) shutdown(t T) {
	x := s.start(t)
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	if err := x.tr.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown must succeed: %v", err)
	}
}
