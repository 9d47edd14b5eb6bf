// Package softmax is a cohort trainer: a softmax classifier (one linear
// layer, softmax cross-entropy) trained by SGD with momentum, in place in
// the arena. Its parameters, "weight" [classes, features] and "bias"
// [classes], are views of the arena from Attach on, so training writes the
// arena and Publish and Adopt copy nothing (a blend excepted). The
// optimizer's velocity lives in the trainer alone; checkpoints hold it.
//
// It trains on Fashion-MNIST (or MNIST) idx files when its settings name
// their directory, and otherwise on synthetic data drawn from the run's
// seed, the same on every rank. A plan's picks name training rows (pick p
// is row p), its GlobalStep sets the learning-rate schedule's step, and
// its LRScale multiplies the rate.
//
// LoadCheckpoint follows the restart contract: a resume restores the
// parameters, the velocity and the counters; a replacement restores the
// velocity and the counters and leaves the arena, which holds newer
// parameters than the checkpoint's, as it is.
//
// It is written as a vendor writes a plugin, against the SDK alone: its
// contract methods, settings checks and checkpoint reads stand alike to
// those of shared/plugintest's mock trainer and of trainer-libtorch, which
// serve the same contract, and share no code with them on purpose.
package softmax

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Name is what Describe reports and what a config file selects:
// trainer "softmax" { ... }.
const Name = "softmax"

// Version is this trainer's own semantic version, reported by Describe.
const Version = "0.1.0"

// Trainer is the softmax trainer. It is safe for concurrent use, with one
// Train at a time.
type Trainer struct {
	log    hclog.Logger
	picker plugin.Picker // Train's alone

	mu          sync.Mutex
	s           Settings
	layout      arena.Layout
	train, eval *split
	// weight and bias are views of the arena once attached.
	weight, bias []float32
	vel          []float32 // momentum: weight's, then bias's
	mapping      *arena.Mapping
	published    []float32 // weight and bias at the last Publish, for a blend
	steps        uint64    // optimizer steps
	lastPub      uint64    // steps at the last Publish
	sched        uint64    // the learning-rate schedule's step
	x, grad, p   []float32 // one row, the batch's gradient, one row's probabilities
}

var _ plugin.Trainer = (*Trainer)(nil)

// New makes an unconfigured trainer; log may be nil.
func New(log hclog.Logger) *Trainer {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Trainer{log: log}
}

// Describe names the trainer and declares its settings.
func (t *Trainer) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: Name, Version: Version, Settings: plugin.SchemaOf(Settings{})}, nil
}

// Configure loads the data and sets the model to zero.
func (t *Trainer) Configure(_ context.Context, cfg plugin.TrainerConfig) (plugin.TrainerSetup, error) {
	s, err := ParseSettings(cfg.Settings)
	if err != nil {
		return plugin.TrainerSetup{}, err
	}
	var train, eval *split
	if s.Data != "" {
		if train, eval, err = loadIdx(s.Data); err != nil {
			return plugin.TrainerSetup{}, err
		}
		s.Classes = idxClasses
	} else {
		train, eval = synthetic(cfg.Seed, int(s.Samples), int(s.EvalSamples), s.Features, s.Classes)
	}
	c, f := s.Classes, train.features
	layout, err := arena.Pack([]arena.Entry{
		{Name: "weight", DType: arena.F32, Shape: []int64{int64(c), int64(f)}, Role: arena.Parameter},
		{Name: "bias", DType: arena.F32, Shape: []int64{int64(c)}, Role: arena.Parameter},
	})
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("softmax: layout: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeLocked()
	t.s, t.layout, t.train, t.eval = s, layout, train, eval
	t.weight, t.bias, t.vel = make([]float32, c*f), make([]float32, c), make([]float32, c*f+c)
	t.x, t.grad, t.p = make([]float32, f), make([]float32, c*f+c), make([]float32, c)
	t.steps, t.lastPub, t.sched, t.published = 0, 0, 0, nil
	t.log.Debug("configured", "rank", cfg.Rank, "samples", train.n, "features", f, "classes", c)
	return plugin.TrainerSetup{Layout: layout, Samples: uint64(train.n), EvalSamples: uint64(eval.n), BatchSize: s.BatchSize}, nil
}

// closeLocked unmaps the arena, keeping the model in memory of its own.
func (t *Trainer) closeLocked() {
	if t.mapping == nil {
		return
	}
	t.weight, t.bias = slices.Clone(t.weight), slices.Clone(t.bias)
	if err := t.mapping.Close(); err != nil {
		t.log.Warn("unmapping the arena", "error", err)
	}
	t.mapping = nil
}

// Attach moves the model into the arena: its values are copied there and
// the parameters become views of it.
func (t *Trainer) Attach(_ context.Context, d arena.Descriptor) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.train == nil {
		return false, errors.New("softmax: Attach before Configure")
	}
	if d.Layout.Digest() != t.layout.Digest() {
		return false, fmt.Errorf("softmax: arena %s has another layout than the model's", d.Path)
	}
	m, err := arena.Open(d)
	if err != nil {
		return false, fmt.Errorf("softmax: %w", err)
	}
	w, err1 := m.Float32s(0)
	b, err2 := m.Float32s(1)
	if err := errors.Join(err1, err2); err != nil {
		m.Close()
		return false, fmt.Errorf("softmax: %w", err)
	}
	copy(w, t.weight)
	copy(b, t.bias)
	t.closeLocked()
	t.mapping, t.weight, t.bias, t.published = m, w, b, nil
	return true, nil
}

// Train runs the plan's picks in batches, one SGD step each.
func (t *Trainer) Train(ctx context.Context, plan plugin.Plan, report func(plugin.BatchReport) error) error {
	scale, err := plan.LRMultiplier()
	if err != nil {
		return fmt.Errorf("softmax: %w", err)
	}
	t.mu.Lock()
	configured := t.mapping != nil
	batch := uint64(t.s.BatchSize)
	if plan.GlobalStep != 0 {
		t.sched = plan.GlobalStep
	}
	t.mu.Unlock()
	if !configured {
		return errors.New("softmax: Train before Attach")
	}
	picks, err := t.picker.Picks(plan)
	if err != nil {
		return fmt.Errorf("softmax: %w", err)
	}
	for b := uint64(0); len(picks) > 0; b++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("softmax: stopped before batch %d: %w", b, err)
		}
		n := min(batch, uint64(len(picks)))
		rep, err := t.step(picks[:n], scale)
		if err != nil {
			return err
		}
		picks = picks[n:]
		rep.Batch = b
		if err := report(rep); err != nil {
			return err
		}
	}
	return nil
}

// step trains the rows picks name: the mean gradient of the softmax
// cross-entropy, then v := μv + g and θ := θ − lr·v, lr the schedule's
// rate times scale.
func (t *Trainer) step(picks []uint64, scale float64) (plugin.BatchReport, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mapping == nil {
		return plugin.BatchReport{}, errors.New("softmax: shut down while training")
	}
	c, f := t.s.Classes, t.train.features
	clear(t.grad)
	var loss float64
	for _, pick := range picks {
		i := int(pick % uint64(t.train.n))
		t.train.row(i, t.x)
		y := int(t.train.labels[i])
		loss += t.probabilities(t.x, y)
		for k := range c {
			g := t.p[k]
			if k == y {
				g--
			}
			row := t.grad[k*f : (k+1)*f]
			for j, v := range t.x {
				row[j] += g * v
			}
			t.grad[c*f+k] += g
		}
	}
	lr := float32(t.s.LR / (1 + t.s.LRDecay*float64(t.sched)) * scale)
	mu, inv := float32(t.s.Momentum), 1/float32(len(picks))
	params := [][]float32{t.weight, t.bias}
	at := 0
	for _, ps := range params {
		for j := range ps {
			t.vel[at] = mu*t.vel[at] + t.grad[at]*inv
			ps[j] -= lr * t.vel[at]
			at++
		}
	}
	t.steps++
	t.sched++
	rep := plugin.BatchReport{Samples: uint32(len(picks)), Loss: loss / float64(len(picks)), StepCount: t.steps,
		Scalars: map[string]float64{"lr": float64(lr)}}
	if t.steps%50 == 0 {
		norm := t.normLocked()
		rep.ParamNorm = &norm
	}
	return rep, nil
}

// probabilities fills t.p with the softmax of the logits of x and returns
// the cross-entropy against label y.
func (t *Trainer) probabilities(x []float32, y int) float64 {
	f := len(x)
	top := math.Inf(-1)
	for k := range t.p {
		z := t.bias[k]
		for j, w := range t.weight[k*f : (k+1)*f] {
			z += w * x[j]
		}
		t.p[k] = z
		top = math.Max(top, float64(z))
	}
	zy := float64(t.p[y])
	var sum float64
	for k, z := range t.p {
		e := math.Exp(float64(z) - top)
		t.p[k] = float32(e)
		sum += e
	}
	for k := range t.p {
		t.p[k] = float32(float64(t.p[k]) / sum)
	}
	return math.Log(sum) + top - zy
}

func (t *Trainer) normLocked() float64 {
	var s float64
	for _, ps := range [][]float32{t.weight, t.bias} {
		for _, v := range ps {
			s += float64(v) * float64(v)
		}
	}
	return math.Sqrt(s)
}

// Publish copies nothing (the arena is the model): it keeps the values
// for a blending Adopt and reports the steps since the last Publish.
func (t *Trainer) Publish(context.Context) (plugin.PublishResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mapping == nil {
		return plugin.PublishResult{}, errors.New("softmax: Publish before Attach")
	}
	t.published = slices.Concat(t.weight, t.bias)
	res := plugin.PublishResult{Steps: t.steps - t.lastPub, StepCount: t.steps, ParamNorm: t.normLocked()}
	t.lastPub = t.steps
	return res, nil
}

// Adopt takes the arena's values, which the model already is; a blend
// writes (1-a)·published + a·arena into the arena.
func (t *Trainer) Adopt(_ context.Context, a float64) (float64, error) {
	if !(a >= 0 && a <= 1) {
		return 0, fmt.Errorf("softmax: blend alpha %v is outside [0, 1]", a)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mapping == nil {
		return 0, errors.New("softmax: Adopt before Attach")
	}
	if a > 0 && a < 1 && t.published != nil {
		at := 0
		for _, ps := range [][]float32{t.weight, t.bias} {
			for j, g := range ps {
				ps[j] = float32((1-a)*float64(t.published[at]) + a*float64(g))
				at++
			}
		}
	}
	return t.normLocked(), nil
}

// Evaluate reports the mean loss and the accuracy on the evaluation split.
func (t *Trainer) Evaluate(context.Context) (plugin.EvalResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.eval == nil {
		return plugin.EvalResult{}, errors.New("softmax: Evaluate before Configure")
	}
	var loss float64
	var right int
	x := make([]float32, t.eval.features)
	for i := range t.eval.n {
		t.eval.row(i, x)
		y := int(t.eval.labels[i])
		loss += t.probabilities(x, y)
		if best := slices.Index(t.p, slices.Max(t.p)); best == y {
			right++
		}
	}
	acc := float64(right) / float64(t.eval.n)
	return plugin.EvalResult{Loss: loss / float64(t.eval.n), Accuracy: &acc, Samples: uint64(t.eval.n)}, nil
}

// Shutdown unmaps the arena.
func (t *Trainer) Shutdown(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeLocked()
	return nil
}
