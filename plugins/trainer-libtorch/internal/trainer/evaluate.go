package trainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/cohortdl/cohort/shared/plugin"
)

var errNoEval = errors.New("libtorch trainer: no test split to evaluate on (data has no t10k-* files, or eval_x/eval_y are not set)")

// Evaluate reports the mean loss (and, for cross_entropy, the accuracy)
// over the whole test split, in eval mode without gradients.
func (t *Trainer) Evaluate(ctx context.Context) (plugin.EvalResult, error) {
	return onCalls(t, func() (plugin.EvalResult, error) { return t.evaluate(ctx) })
}

func (t *Trainer) evaluate(ctx context.Context) (plugin.EvalResult, error) {
	t.lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return plugin.EvalResult{}, errors.New("libtorch trainer: Evaluate before Configure")
	}
	d := t.eval
	if d == nil {
		return plugin.EvalResult{}, errNoEval
	}
	b := t.evalBuf
	chunk := len(b.idx)
	var lossSum float64
	var correct int64
	for lo := 0; lo < d.N(); lo += chunk {
		if err := ctx.Err(); err != nil {
			return plugin.EvalResult{}, fmt.Errorf("libtorch trainer: evaluation stopped: %w", err)
		}
		b.n = min(chunk, d.N()-lo)
		for i := range b.n {
			b.idx[i] = uint64(lo + i)
		}
		x := b.x[:b.n*d.Features()]
		y, tg := b.targets(d.Width())
		d.Gather(b.idx[:b.n], x, y, tg)
		l, c, err := t.model.Evaluate(x, b.n, y, tg, d.Width(), t.errBuf)
		if err != nil {
			return plugin.EvalResult{}, fmt.Errorf("libtorch trainer: %w", err)
		}
		lossSum += l
		correct += c
	}
	res := plugin.EvalResult{Loss: lossSum / float64(d.N()), Samples: uint64(d.N())}
	if d.Labels() != nil {
		acc := float64(correct) / float64(d.N())
		res.Accuracy = &acc
	}
	return res, nil
}

// EpochEnd runs the TorchScript model's epoch_end(epoch) method, when it
// has one, between plans: the user's code at an epoch's end
// (plugin.EpochEnder).
func (t *Trainer) EpochEnd(_ context.Context, epoch uint64) (bool, error) {
	return onCalls(t, func() (bool, error) { return t.epochEnd(epoch) })
}

func (t *Trainer) epochEnd(epoch uint64) (bool, error) {
	t.lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return false, errors.New("libtorch trainer: EpochEnd before Configure")
	}
	ran, err := t.model.EpochEnd(epoch)
	if err != nil {
		return false, fmt.Errorf("libtorch trainer: the model's epoch_end(%d): %w", epoch, err)
	}
	return ran, nil
}
