package trainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Attach maps the arena, copies the parameters into it and (on the CPU)
// makes every tensor a view of it.
func (t *Trainer) Attach(_ context.Context, d arena.Descriptor) (bool, error) {
	return onCalls(t, func() (bool, error) { return t.attach(d) })
}

func (t *Trainer) attach(d arena.Descriptor) (bool, error) {
	t.lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return false, errors.New("libtorch trainer: Attach before Configure")
	}
	if d.Layout.Digest() != t.layout.Digest() {
		return false, fmt.Errorf("libtorch trainer: arena %s has a different layout (%d tensors, %d bytes) than the model (%d tensors, %d bytes)",
			d.Path, len(d.Layout.Entries), d.Layout.Size, len(t.layout.Entries), t.layout.Size)
	}
	m, err := arena.Open(d)
	if err != nil {
		return false, fmt.Errorf("libtorch trainer: %w", err)
	}
	offsets := make([]uint64, len(d.Layout.Entries))
	for i, e := range d.Layout.Entries {
		offsets[i] = e.Offset
	}
	// Rounds that run while training need the parameters out of the
	// arena the averager works on.
	zc, err := t.model.Attach(m.Bytes(), offsets, t.forceCopy || t.cfg.OverlapRounds)
	if err != nil {
		// Some tensors may already view the new block: keep both mapped
		// until the model is gone.
		t.retired = append(t.retired, m)
		return false, fmt.Errorf("libtorch trainer: arena %s: %w", d.Path, err)
	}
	if t.mapping != nil {
		if err := t.mapping.Close(); err != nil {
			t.logger.Warn("closing the previous arena", "error", err)
		}
	}
	t.mapping, t.zeroCopy, t.published = m, zc, false
	t.logger.Debug("attached", "arena", d.Path, "bytes", d.Layout.Size, "zero_copy", zc)
	return zc, nil
}

// Publish makes the arena hold the parameters: nothing to copy when they
// live there (zero-copy), a copy otherwise. In both cases the values are
// kept for a blending Adopt.
func (t *Trainer) Publish(context.Context) (plugin.PublishResult, error) {
	return onCalls(t, t.publish)
}

func (t *Trainer) publish() (plugin.PublishResult, error) {
	t.lock()
	defer t.mu.Unlock()
	if err := t.attachedLocked("Publish"); err != nil {
		return plugin.PublishResult{}, err
	}
	norm, err := t.model.Publish()
	if err != nil {
		return plugin.PublishResult{}, fmt.Errorf("libtorch trainer: %w", err)
	}
	t.noteHostCopy()
	res := plugin.PublishResult{Steps: t.steps - t.lastPub, StepCount: t.steps, ParamNorm: norm, HostCopyBytes: t.hostCopy}
	t.lastPub, t.published, t.hostCopy = t.steps, true, 0
	return res, nil
}

// Adopt makes the model use the arena's values (already the case for
// views); with blendAlpha in (0,1) every float tensor becomes
// (1-a)·published + a·arena. 0 and 1 overwrite. Steps trained since
// Publish (a round that ran during training) are credited: every float
// tensor becomes current + a·(arena − published), a = 1 for an overwrite.
func (t *Trainer) Adopt(_ context.Context, blendAlpha float64) (float64, error) {
	if !(blendAlpha >= 0 && blendAlpha <= 1) {
		return 0, fmt.Errorf("libtorch trainer: blend alpha %v is outside [0, 1]", blendAlpha)
	}
	return onCalls(t, func() (float64, error) { return t.adopt(blendAlpha) })
}

func (t *Trainer) adopt(blendAlpha float64) (float64, error) {
	t.lock()
	defer t.mu.Unlock()
	if err := t.attachedLocked("Adopt"); err != nil {
		return 0, err
	}
	// Only a trainer configured for rounds beside training credits steps:
	// otherwise a step between Publish and Adopt is a caller's interleaving
	// (the model lives in the arena), not a round's overshoot.
	credit := t.cfg.OverlapRounds && t.published && t.steps != t.lastPub
	norm, err := t.model.Adopt(blendAlpha, credit)
	if err != nil {
		return 0, fmt.Errorf("libtorch trainer: %w", err)
	}
	t.noteHostCopy()
	return norm, nil
}

// noteHostCopy counts a Publish's or an Adopt's copy of the arena between
// the model's device memory and the host's: none for a model on the CPU,
// nor for one whose parameters are in a device block.
func (t *Trainer) noteHostCopy() {
	if t.s.Device != "cpu" && t.device == nil {
		t.hostCopy += t.layout.Size
	}
}

func (t *Trainer) attachedLocked(op string) error {
	switch {
	case t.model == nil:
		return fmt.Errorf("libtorch trainer: %s before Configure", op)
	case t.mapping == nil:
		return fmt.Errorf("libtorch trainer: %s before Attach", op)
	}
	return nil
}
