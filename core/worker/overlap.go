package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// overlapRound is an averaging round running on a goroutine of its own
// while the rank trains (Sync.overlap, the async policy): the averager
// works on the arena the trainer just published to, while the trainer,
// which keeps its parameters out of the arena (TrainerConfig.OverlapRounds),
// trains on; its Adopt then credits the steps trained meanwhile. The main
// loop owns it: it starts the round, polls it between batches, and joins
// it before anything else touches the averager.
type overlapRound struct {
	rr     *roundRun
	done   chan roundOutcome // buffered: the goroutine never blocks on it
	cancel context.CancelCauseFunc
}

// duringRound reports whether m may be handled while an overlapped round
// is in flight: commands that only queue plans or steer them. Any other
// waits for the round, as it would for a blocking one.
func duringRound(m any) bool {
	switch m.(type) {
	case *wirepb.StartEpoch, *wirepb.Update, *wirepb.SetGlobalStep, *wirepb.ExtendPartition, *wirepb.Throttle:
		return true
	}
	return false
}

// overlappable reports whether m's round may run while the rank trains.
func (w *worker) overlappable(m *wirepb.Sync) bool {
	return w.sup.CanOverlap() && m.GetOverlap() && m.GetMode() == wirepb.SyncMode_SYNC_MODE_AVERAGE
}

// startOverlap begins m's round and leaves its averaging to a goroutine.
func (w *worker) startOverlap(ctx context.Context, m *wirepb.Sync) error {
	if !w.training {
		defer w.holdTraining(time.Now())
	}
	rr, err := w.beginRound(ctx, m)
	if rr == nil || err != nil {
		return err
	}
	rctx, cancel := context.WithCancelCause(w.connCtx)
	o := &overlapRound{rr: rr, done: make(chan roundOutcome, 1), cancel: cancel}
	w.ovl = o
	w.ovlWG.Add(1)
	go func() {
		defer w.ovlWG.Done()
		o.done <- w.average(rctx, rr)
	}()
	w.log.Debug("round runs while training", "round", rr.n)
	return nil
}

// pollOverlap runs between batches: it finishes the round in flight once
// its averaging is done, or starts the one the coordinator asked for.
func (w *worker) pollOverlap(ctx context.Context) error {
	if w.ovl != nil {
		select {
		case out := <-w.ovl.done:
			return w.finishOverlap(ctx, out)
		default:
			return nil
		}
	}
	if !w.sup.CanOverlap() {
		return nil
	}
	// Commands that only queue or steer plans may stand before the Sync:
	// they are handled now, as they would be after this plan (they change
	// nothing of it).
	for !w.plans.throttled {
		c, ok := w.queue.popIf(func(c command) bool {
			s, ok := c.msg.(*wirepb.Sync)
			return c.err == nil && (duringRound(c.msg) || ok && w.overlappable(s))
		})
		if !ok {
			return nil
		}
		if s, ok := c.msg.(*wirepb.Sync); ok {
			return w.startOverlap(ctx, s)
		}
		if _, _, err := w.handle(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// waitOverlap waits for the round in flight and finishes it.
func (w *worker) waitOverlap(ctx context.Context) error {
	start := time.Now()
	select {
	case out := <-w.ovl.done:
		w.holdTraining(start)
		return w.finishOverlap(ctx, out)
	case <-ctx.Done():
		w.holdTraining(start)
		return fmt.Errorf("wait for averaging round %d: %w", w.ovl.rr.n, ctx.Err())
	}
}

func (w *worker) finishOverlap(ctx context.Context, out roundOutcome) error {
	if !w.training {
		defer w.holdTraining(time.Now())
	}
	o := w.ovl
	w.ovl = nil
	o.cancel(nil)
	return w.endRound(ctx, o.rr, out)
}

// abortOverlap ends the round in flight without taking its result (the
// trainer it would adopt into is lost, and its Train has returned): the
// coordinator runs it again. With finish, the round's averaging runs to
// its end first, so that the peers' rounds get this rank's part (see
// releaseLost); else it is cancelled.
func (w *worker) abortOverlap(ctx context.Context, why error, finish bool) error {
	defer w.holdTraining(time.Now())
	o := w.ovl
	w.ovl = nil
	if !finish {
		o.cancel(why)
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		o.cancel(why)
		<-o.done
	}
	o.cancel(why) // releases the round's context; the round is over
	return w.abortedAck(ctx, o.rr.ack, o.rr.start, fmt.Errorf("%w: %v", errRoundLostTrainer, why))
}

// errRoundLostTrainer aborts an overlapped round whose trainer was lost.
var errRoundLostTrainer = errors.New("the trainer was lost while the round ran")

// releaseLost ends what still uses a lost plugin of kind before the
// supervisor replaces it: a round running beside the training the trainer
// was lost in (it would adopt into the lost trainer), which the
// coordinator runs again. A lost trainer's round finishes its averaging
// first: the averager works on the arena, not on the trainer, and the
// peers wait in the round's exchange for this rank's part, which a round
// cancelled before posting it never sends (nothing but a death or a stop
// ends a round). A lost averager's round is cancelled: its calls fail.
func (w *worker) releaseLost(ctx context.Context, kind pluginhost.Kind, cause error) error {
	if w.ovl == nil {
		return nil
	}
	return w.abortOverlap(ctx, cause, kind == pluginhost.Trainer)
}

// joinOverlap stops and waits for a round still in flight as the main
// loop returns, so no goroutine outlives it.
func (w *worker) joinOverlap() {
	if w.ovl != nil {
		w.ovl.cancel(errors.New("the worker is stopping"))
		w.ovl = nil
	}
	w.ovlWG.Wait()
}
