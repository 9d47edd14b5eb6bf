package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// loopState belongs to the main loop's goroutine alone.
type loopState struct {
	// role is the epoch-callback rank, once the coordinator named one.
	role *uint32
	// fired is the epoch whose first plan last fired the callback check.
	fired *uint64

	// members is the averaging session, global ranks in session order.
	members []uint32
	// sessionAborts is the watchdog's abort count when the session began:
	// a failed round is an abort, not an averager fault, when the watchdog
	// aborted during this session.
	sessionAborts uint64
	// pendingSteps are the steps published since the last successful
	// round: the weight of the next one.
	pendingSteps uint64
	// divergence of the last round, sent with the first Batch after it.
	divergence *float64
	// saved: a ShutdownWithSave was handled.
	saved bool
	// ovl is a round running beside training (Supervisor.CanOverlap),
	// ovlWG its goroutine; training is set while Train runs.
	ovl      *overlapRound
	ovlWG    sync.WaitGroup
	training bool
	// held is what the rank trained since its last successful round: what
	// a coordinator that comes back learns of this model.
	held heldWork
	// roundHeld is how long rounds held training since the last Metrics:
	// whole rounds and round steps taken between plans, and, while Train
	// runs beside a round, what its batches say they waited for the
	// round's Publish and Adopt (BatchReport.RoundWaitMS).
	roundHeld time.Duration

	prof profile
}

func newLoopState(world uint32) loopState {
	members := make([]uint32, world)
	for i := range members {
		members[i] = uint32(i)
	}
	return loopState{members: members}
}

// mainLoop handles commands in order and runs plans between them: every
// command already queued is handled before a plan starts, so a round the
// coordinator asked for is not held back by a whole chunk of training.
// While a plan trains, commands queue; a stop interrupts the plan.
func (w *worker) mainLoop(ctx context.Context) (clean bool, err error) {
	defer w.joinOverlap()
	w.beginWait(time.Now())
	for {
		if w.ovl != nil {
			// While a round runs beside training, only commands that queue
			// plans go ahead of it, and the rank trains what it holds;
			// anything else (and an idle rank) waits for the round.
			head, queued := w.queue.peek()
			if (queued && !duringRound(head.msg)) || (!queued && !w.plans.ready()) {
				if err := w.waitOverlap(ctx); err != nil {
					return false, err
				}
				continue
			}
			if err := w.pollOverlap(ctx); err != nil {
				return false, err
			}
		}
		c, ok := w.queue.tryPop()
		if !ok {
			if w.plans.ready() {
				if err := w.runNextPlan(ctx); err != nil {
					return false, err
				}
				continue
			}
			if c, err = w.queue.pop(ctx); err != nil {
				return false, fmt.Errorf("wait for a command: %w", err)
			}
		}
		exit, clean, err := w.handle(ctx, c)
		if exit || err != nil {
			return clean, err
		}
	}
}

// handle runs one command; exit reports that the worker is done.
func (w *worker) handle(ctx context.Context, c command) (exit, clean bool, err error) {
	if c.err != nil {
		return true, false, c.err
	}
	w.prof.commands++
	// Any command (heartbeats never get here) ends a throttle.
	w.plans.throttled = false
	switch m := c.msg.(type) {
	case *wirepb.StartEpoch:
		if m.GetPlan() == nil {
			w.log.Warn("ignoring StartEpoch without a plan")
			break
		}
		w.plans.add(m.GetPlan())
	case *wirepb.Update:
		w.log.Debug("update", "version", m.GetVersion(), "next_plan", m.GetNextPlan() != nil)
		if m.GetNextPlan() != nil {
			w.plans.add(m.GetNextPlan())
		}
	case *wirepb.Sync:
		if w.overlappable(m) && w.plans.ready() {
			err = w.startOverlap(ctx, m)
		} else {
			err = w.round(ctx, m)
		}
	case *wirepb.Throttle:
		w.plans.throttled = true
		w.log.Debug("throttled")
	case *wirepb.SetGlobalStep:
		w.plans.setStep(m.GetGlobalStep())
	case *wirepb.Checkpoint:
		if m.GetTargetRank() == w.o.Rank {
			err = w.checkpoint(ctx, m)
		}
	case *wirepb.Evaluate:
		if m.GetTargetRank() == w.o.Rank {
			err = w.evaluate(ctx, m)
		}
	case *wirepb.ExtendPartition:
		w.plans.extend(m, planShape{seed: w.admit.GetSeed(), pickSpace: w.sup.Setup().Samples})
		w.log.Info("partition extended", "epoch", m.GetEpoch()+1, "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
	case *wirepb.EpochEnd:
		if m.GetTargetRank() == w.o.Rank {
			err = w.epochEnd(ctx, m.GetEpoch())
		}
	case *wirepb.SetEpochCallbackRole:
		r := m.GetRank()
		w.role = &r
	case *wirepb.Shutdown:
		w.log.Info("shutdown requested")
		return true, true, nil
	case *wirepb.ShutdownWithSave:
		w.log.Info("shutdown with save requested", "reason", m.GetReason(), "dir", m.GetDir(), "version", m.GetVersion())
		return true, true, w.shutdownWithSave(ctx, m)
	default:
		w.log.Warn("ignoring an unexpected command", "type", fmt.Sprintf("%T", c.msg))
	}
	return false, false, err
}

// runNextPlan fires the epoch callback when due, trains the next plan,
// forwarding each batch, and closes it with Metrics. A plan interrupted by
// a stop sends no Metrics; the stop's command is in the queue. Nor does a
// plan lost with its trainer: the supervisor replaces the trainer, and the
// coordinator hands out again what the plan's reports do not cover.
func (w *worker) runNextPlan(ctx context.Context) error {
	qp := w.plans.next()
	p := qp.plan
	w.endWait(time.Now())
	defer func() { w.beginWait(time.Now()) }()
	if err := w.fireEpochFn(ctx, p.Epoch); err != nil {
		return err
	}

	var st planStats
	reports := newBatchMerger(w, p)
	start := time.Now()
	w.training = true
	onGroup := func(group []plugin.BatchReport) error {
		for _, b := range group {
			from := st.samples
			w.roundHeld += st.add(b)
			w.held.note(p, from, uint64(b.Samples))
			w.held.stepped(b.StepCount)
			reports.add(b)
		}
		if err := reports.groupDone(len(group)); err != nil {
			return err
		}
		return w.pollOverlap(ctx)
	}
	var err error
	if g, ok := w.sup.Trainer().(plugin.GroupedTrainer); ok {
		err = g.TrainGrouped(w.connCtx, p, onGroup)
	} else {
		err = w.sup.Trainer().Train(w.connCtx, p, func(b plugin.BatchReport) error {
			return onGroup([]plugin.BatchReport{b})
		})
	}
	w.training = false
	elapsed := time.Since(start)
	if ferr := reports.flush(ctx); err == nil && ferr != nil {
		err = ferr
	}
	w.prof.planDone(elapsed, st)
	st.warnDropped(w.log, p)
	if err != nil {
		if w.connCtx.Err() != nil {
			w.log.Info("plan interrupted", "epoch", p.Epoch+1, "batches_done", st.batches, "reason", context.Cause(w.connCtx))
			w.held.cut = &cutPlan{plan: p, reported: st.samples}
			return nil
		}
		if lost, rerr := w.sup.Recover(ctx, pluginhost.Trainer, err, &p); lost {
			w.held.heard = false // a new trainer counts from its checkpoint
			w.log.Warn("plan lost with the trainer", "epoch", p.Epoch+1, "offset", p.PartitionOffset, "size", p.PartitionSize, "batches_done", st.batches)
			return rerr
		}
		return fmt.Errorf("train epoch %d, plan [%d, +%d): %w", p.Epoch, p.PartitionOffset, p.PartitionSize, err)
	}
	m := st.metrics(p, elapsed)
	m.Rank, m.RoundWaitMs, m.Resources = w.o.Rank, plugin.Milliseconds(w.roundHeld), w.lastSample.Load()
	w.roundHeld = 0
	return w.send(ctx, m)
}

// fireEpochFn runs the epoch callback once per epoch, before the epoch's
// first plan, on the rank that holds the role.
func (w *worker) fireEpochFn(ctx context.Context, epoch uint64) error {
	if w.fired != nil && *w.fired == epoch {
		return nil
	}
	w.fired = &epoch
	if w.role == nil || *w.role != w.o.Rank || w.o.EpochFn == nil {
		return nil
	}
	start := time.Now()
	if err := w.o.EpochFn(ctx, epoch); err != nil {
		w.log.Warn("epoch callback failed", "epoch", epoch+1, "error", err)
	}
	return w.send(ctx, &wirepb.EpochFnElapsed{Rank: w.o.Rank, Epoch: epoch, ElapsedMs: plugin.Milliseconds(time.Since(start))})
}

// send writes one frame, naming it in the error (link.Send); the
// supervisor, made before the link, sends through it too.
func (w *worker) send(ctx context.Context, msg proto.Message) error { return w.link.Send(ctx, msg) }

func isShutdown(m proto.Message) bool {
	_, ok := m.(*wirepb.Shutdown)
	return ok
}

func isShutdownWithSave(m proto.Message) bool {
	_, ok := m.(*wirepb.ShutdownWithSave)
	return ok
}

// epochEnd runs the trainer's end-of-epoch code, where it has any, and
// reports its time (which is not batch time).
func (w *worker) epochEnd(ctx context.Context, epoch uint64) error {
	e, ok := w.sup.Trainer().(plugin.EpochEnder)
	if !ok {
		return nil
	}
	start := time.Now()
	ran, err := e.EpochEnd(ctx, epoch)
	if err != nil {
		if lost, rerr := w.sup.Recover(ctx, pluginhost.Trainer, err, nil); lost {
			return rerr
		}
		// User code failing at an epoch's end costs the run nothing it has
		// trained: say so and go on, as a failed evaluation does.
		w.log.Warn("the trainer's end-of-epoch code failed", "epoch", epoch+1, "error", err)
		return nil
	}
	if !ran {
		return nil
	}
	w.log.Debug("end-of-epoch code ran", "epoch", epoch+1, "ms", plugin.Milliseconds(time.Since(start)))
	return w.send(ctx, &wirepb.EpochFnElapsed{Rank: w.o.Rank, Epoch: epoch, ElapsedMs: plugin.Milliseconds(time.Since(start))})
}
