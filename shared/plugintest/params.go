package plugintest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The mock trainer's side of the arena: Attach, Publish and Adopt, with the
// model in Go memory (copied in and out) or in the arena itself (zero_copy).

// releaseLocked closes the arena mapping and the ledger. A model that lived
// in the arena is copied out first, so Snapshot still reads it.
func (t *Trainer) releaseLocked() error {
	var errs []error
	if t.mapping != nil {
		t.detachLocked()
		errs = append(errs, t.mapping.Close())
		t.mapping = nil
	}
	t.pub = t.pub[:0]
	if t.ledger != nil {
		errs = append(errs, t.ledger.Close())
		t.ledger = nil
	}
	return errors.Join(errs...)
}

// detachLocked moves a model that lives in the arena into Go memory.
func (t *Trainer) detachLocked() {
	if t.zeroCopy {
		t.weight, t.bias, t.mean = slices.Clone(t.weight), slices.Clone(t.bias), slices.Clone(t.mean)
		t.zeroCopy = false
	}
}

// Attach maps the arena; its layout must be the one Configure returned.
// With zero_copy (and no rounds beside training) the model's values move
// into it and its tensors become views of it: zeroCopy true. Otherwise the
// mock copies on Publish and Adopt.
func (t *Trainer) Attach(_ context.Context, d arena.Descriptor) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.data == nil {
		return false, errors.New("mock trainer: Attach before Configure")
	}
	if d.Layout.Digest() != t.layout.Digest() {
		return false, fmt.Errorf("mock trainer: arena %s has a different layout (%d entries, %d bytes) than the model (%d entries, %d bytes)",
			d.Path, len(d.Layout.Entries), d.Layout.Size, len(t.layout.Entries), t.layout.Size)
	}
	m, err := arena.Open(d)
	if err != nil {
		return false, fmt.Errorf("mock trainer: %w", err)
	}
	zeroCopy := t.settings.ZeroCopy && !t.cfg.OverlapRounds
	var w, b, mean []float32
	if zeroCopy {
		if w, b, mean, err = views(m, "Attach"); err != nil {
			m.Close()
			return false, err
		}
		copy(w, t.weight)
		copy(b, t.bias)
		copy(mean, t.mean)
	}
	if t.mapping != nil {
		t.detachLocked()
		if err := t.mapping.Close(); err != nil {
			t.logger.Warn("closing the previous arena", "error", err)
		}
	}
	t.mapping, t.pub = m, t.pub[:0]
	if zeroCopy {
		t.weight, t.bias, t.mean, t.zeroCopy = w, b, mean, true
	}
	return zeroCopy, nil
}

// views are the arena's three tensors.
func views(m *arena.Mapping, op string) (w, b, mean []float32, err error) {
	if w, err = m.Float32s(entryWeight); err == nil {
		if b, err = m.Float32s(entryBias); err == nil {
			mean, err = m.Float32s(entryFeatureMean)
		}
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("mock trainer: %s: %w", op, err)
	}
	return w, b, mean, nil
}

// tensorsLocked views the arena's three tensors.
func (t *Trainer) tensorsLocked(op string) (w, b, m []float32, err error) {
	if t.mapping == nil {
		return nil, nil, nil, fmt.Errorf("mock trainer: %s before Attach", op)
	}
	return views(t.mapping, op)
}

// normLocked is the L2 norm of the parameters (weight and bias).
func (t *Trainer) normLocked() float64 {
	s := float64(t.bias[0]) * float64(t.bias[0])
	for _, v := range t.weight {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// Publish copies parameters and buffer into the arena (nothing to copy
// when they live there) and keeps them for a blending Adopt.
func (t *Trainer) Publish(context.Context) (plugin.PublishResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, b, m, err := t.tensorsLocked("Publish")
	if err != nil {
		return plugin.PublishResult{}, err
	}
	if !t.zeroCopy {
		copy(w, t.weight)
		copy(b, t.bias)
		copy(m, t.mean)
	}
	t.pub = append(append(append(t.pub[:0], t.weight...), t.bias...), t.mean...)
	res := plugin.PublishResult{Steps: t.steps - t.lastPub, StepCount: t.steps, ParamNorm: t.normLocked(), HostCopyBytes: t.settings.HostCopyBytes}
	t.lastPub = t.steps
	return res, nil
}

// Adopt takes the arena's parameters and buffer (already the model's when
// it lives there); with blendAlpha in (0,1) every value becomes
// (1-a)·local + a·arena instead, local being the last Publish's (computed
// in float64). blendAlpha 0 or 1 overwrites; outside [0,1] is an error.
// When steps ran since Publish (a round during Train) every value becomes
// local + a·(arena − published) instead, a = 1 for an overwrite.
func (t *Trainer) Adopt(_ context.Context, blendAlpha float64) (float64, error) {
	if !(blendAlpha >= 0 && blendAlpha <= 1) {
		return 0, fmt.Errorf("mock trainer: blend alpha %v is outside [0, 1]", blendAlpha)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.trainMu.TryLock() {
		t.trainMu.Unlock()
	} else {
		t.adopts++
		if n := t.settings.ExitOnAdopt; n != 0 && t.adopts == n {
			os.Exit(3)
		}
	}
	w, b, m, err := t.tensorsLocked("Adopt")
	if err != nil {
		return 0, err
	}
	published := len(t.pub) == 2*len(t.weight)+1
	switch {
	case t.zeroCopy && (blendAlpha == 0 || blendAlpha == 1 || !published):
		// The model is the arena's values.
	case t.zeroCopy:
		t.blendLocked(t.pub, blendAlpha)
	case t.steps != t.lastPub && published:
		t.creditLocked(w, b, m, blendAlpha)
	case blendAlpha == 0 || blendAlpha == 1:
		copy(t.weight, w)
		copy(t.bias, b)
		copy(t.mean, m)
	default:
		t.blendLocked(slices.Concat(w, b, m), blendAlpha)
	}
	return t.normLocked(), nil
}

// blendLocked blends the model with other (weight, bias, mean in a row):
// for a model in the arena, other is the published values and the model
// the arena's; otherwise the other way round. Either way the result is
// (1-a)·published + a·arena.
func (t *Trainer) blendLocked(other []float32, a float64) {
	n := len(t.weight)
	blend := func(dst []float32, src []float32) {
		for j := range dst {
			local, global := float64(src[j]), float64(dst[j])
			if !t.zeroCopy {
				local, global = global, local
			}
			dst[j] = float32((1-a)*local + a*global)
		}
	}
	blend(t.weight, other[:n])
	blend(t.bias, other[n:n+1])
	blend(t.mean, other[n+1:])
}

// creditLocked keeps the steps trained since Publish: every value becomes
// current + a·(arena − published).
func (t *Trainer) creditLocked(w, b, m []float32, blendAlpha float64) {
	a := blendAlpha
	if a == 0 {
		a = 1
	}
	credit := func(local, global, published float32) float32 {
		return float32(float64(local) + a*(float64(global)-float64(published)))
	}
	n := len(t.weight)
	for j := range t.weight {
		t.weight[j] = credit(t.weight[j], w[j], t.pub[j])
		t.mean[j] = credit(t.mean[j], m[j], t.pub[n+1+j])
	}
	t.bias[0] = credit(t.bias[0], b[0], t.pub[n])
}
