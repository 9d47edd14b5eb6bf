package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	sharena "github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// loopState belongs to the main loop's goroutine alone.
type loopState struct {
	// plans run in order; extensions go first (see extend).
	plans []queuedPlan
	// held are plans that came with a Sync whose round has not succeeded
	// yet: they run after the next successful round, in order.
	held      []*wirepb.EpochPlan
	throttled bool
	// globalStep is the coordinator's last SetGlobalStep; stepFresh says
	// the next plan has not passed it to Train yet.
	globalStep uint64
	stepFresh  bool
	// role is the epoch-callback rank, once the coordinator named one.
	role *uint32
	// fired is the epoch whose first plan last fired the callback check.
	fired *uint64
	// shapes remembers each epoch's permutation (seed, pick space), which
	// an ExtendPartition does not repeat.
	shapes   map[uint64]planShape
	lastPlan *planShape

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
	// canOverlap: rounds marked Sync.overlap may run while the rank trains
	// (Admit.overlap_rounds, and a trainer that keeps its parameters out
	// of the arena); ovl is such a round in flight, ovlWG its goroutine;
	// training is set while Train runs.
	canOverlap bool
	// device is the trainer's parameters on its GPU, handed to the
	// averager in its arena descriptor, when both plugins take device
	// blocks (plugin.CapDeviceBlock) and the trainer exported one.
	device       *sharena.DeviceBlock
	deviceBlocks bool // both plugins take device blocks
	ovl          *overlapRound
	ovlWG        sync.WaitGroup
	training     bool
	// roundHeld is how long rounds held training since the last Metrics:
	// whole rounds and round steps taken between plans, and, while Train
	// runs beside a round, what its batches say they waited for the
	// round's Publish and Adopt (BatchReport.RoundWaitMS).
	roundHeld time.Duration

	prof profile
}

type queuedPlan struct {
	plan      plugin.Plan
	extension bool
	// reportEvery, when not 0, lets the plan's Batch frames merge (see
	// EpochPlan.report_interval_ms).
	reportEvery time.Duration
}

// planShape is what an ExtendPartition of an epoch does not repeat: it
// takes them from a plan of that epoch.
type planShape struct {
	seed, pickSpace uint64
	lrScale         float64
}

func newLoopState(world uint32) loopState {
	members := make([]uint32, world)
	for i := range members {
		members[i] = uint32(i)
	}
	return loopState{members: members, shapes: map[uint64]planShape{}}
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
			idle := len(w.plans) == 0 || w.throttled
			if (queued && !duringRound(head.msg)) || (!queued && idle) {
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
			if len(w.plans) > 0 && !w.throttled {
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
	w.throttled = false
	switch m := c.msg.(type) {
	case *wirepb.StartEpoch:
		if m.GetPlan() == nil {
			w.log.Warn("ignoring StartEpoch without a plan")
			break
		}
		w.queuePlan(m.GetPlan())
	case *wirepb.Update:
		w.log.Debug("update", "version", m.GetVersion(), "next_plan", m.GetNextPlan() != nil)
		if m.GetNextPlan() != nil {
			w.queuePlan(m.GetNextPlan())
		}
	case *wirepb.Sync:
		if w.overlappable(m) && len(w.plans) > 0 && !w.throttled {
			err = w.startOverlap(ctx, m)
		} else {
			err = w.round(ctx, m)
		}
	case *wirepb.Throttle:
		w.throttled = true
		w.log.Debug("throttled")
	case *wirepb.SetGlobalStep:
		w.globalStep, w.stepFresh = m.GetGlobalStep(), true
	case *wirepb.Checkpoint:
		if m.GetTargetRank() == w.o.Rank {
			err = w.checkpoint(ctx, m)
		}
	case *wirepb.Evaluate:
		if m.GetTargetRank() == w.o.Rank {
			err = w.evaluate(ctx, m)
		}
	case *wirepb.ExtendPartition:
		w.extend(m)
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

func (w *worker) queuePlan(p *wirepb.EpochPlan) {
	shape := planShape{seed: p.GetSeed(), pickSpace: p.GetPickSpace(), lrScale: p.GetLrScale()}
	w.shapes[p.GetEpoch()] = shape
	w.lastPlan = &shape
	w.plans = append(w.plans, queuedPlan{plan: plugin.Plan{
		Epoch:           p.GetEpoch(),
		PartitionOffset: p.GetPartitionOffset(),
		PartitionSize:   p.GetPartitionSize(),
		Seed:            p.GetSeed(),
		PickSpace:       p.GetPickSpace(),
		LRScale:         p.GetLrScale(),
	}, reportEvery: time.Duration(p.GetReportIntervalMs()) * time.Millisecond})
}

// extend queues an ExtendPartition range as a plan of its own, to run right
// after the current plan (behind earlier extensions, ahead of later
// chunks). The frame does not repeat the epoch's seed and pick space: they
// come from a plan of that epoch, else from the latest plan, else from the
// run's seed and the trainer's sample count.
func (w *worker) extend(m *wirepb.ExtendPartition) {
	shape, ok := w.shapes[m.GetEpoch()]
	switch {
	case ok:
	case w.lastPlan != nil:
		shape = *w.lastPlan
	default:
		shape = planShape{seed: w.admit.GetSeed(), pickSpace: w.setup.Samples}
	}
	at := 0
	for at < len(w.plans) && w.plans[at].extension {
		at++
	}
	w.plans = slices.Insert(w.plans, at, queuedPlan{extension: true, plan: plugin.Plan{
		Epoch:           m.GetEpoch(),
		PartitionOffset: m.GetPartitionOffset(),
		PartitionSize:   m.GetPartitionSize(),
		Seed:            shape.seed,
		PickSpace:       shape.pickSpace,
		LRScale:         shape.lrScale,
	}})
	w.log.Info("partition extended", "epoch", m.GetEpoch(), "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
}

// planStats accumulates one plan's batches.
type planStats struct {
	batches, samples  uint64
	loss              float64
	computeMS, dataMS float64
	scalars           scalarSums
}

// runNextPlan fires the epoch callback when due, trains the next plan,
// forwarding each batch, and closes it with Metrics. A plan interrupted by
// a stop sends no Metrics; the stop's command is in the queue.
func (w *worker) runNextPlan(ctx context.Context) error {
	p, reportEvery := w.plans[0].plan, w.plans[0].reportEvery
	w.plans = w.plans[1:]
	// Passed once: between SetGlobalSteps the trainer counts on from it (a
	// cohort of one rank runs many plans without a round).
	if w.stepFresh {
		p.GlobalStep, w.stepFresh = w.globalStep, false
	}

	w.endWait(time.Now())
	defer func() { w.beginWait(time.Now()) }()
	if err := w.fireEpochFn(ctx, p.Epoch); err != nil {
		return err
	}

	var st planStats
	reports := newBatchMerger(w, p, reportEvery)
	report := func(b plugin.BatchReport) error {
		st.batches++
		st.samples += uint64(b.Samples)
		st.loss += b.Loss
		st.dataMS += b.DataMS
		st.computeMS += max(b.BatchMS-b.DataMS, 0)
		st.scalars.add(b.Scalars)
		if v := b.RoundWaitMS; v > 0 && v <= b.BatchMS && !math.IsInf(b.BatchMS, 0) {
			w.roundHeld += time.Duration(v * float64(time.Millisecond))
		}
		if err := reports.add(b); err != nil {
			return err
		}
		return w.pollOverlap(ctx)
	}
	start := time.Now()
	w.training = true
	err := w.trainer.Train(w.stopCtx, p, report)
	w.training = false
	elapsed := time.Since(start)
	if ferr := reports.flush(); err == nil && ferr != nil {
		err = ferr
	}
	w.prof.run += elapsed
	w.prof.computeMS += st.computeMS
	w.prof.dataMS += st.dataMS
	w.prof.plans++
	if sc := st.scalars; sc.badNames+sc.overLimit > 0 {
		w.log.Warn("dropped trainer scalars: a name is 1 to 64 bytes of [a-z0-9_./-], and a plan keeps its first names up to the limit",
			"epoch", p.Epoch, "offset", p.PartitionOffset, "invalid_name", sc.badNames, "over_limit", sc.overLimit,
			"limit", plugin.MaxScalars, "example", fmt.Sprintf("%q", sc.example))
	}
	if err != nil {
		if w.stopCtx.Err() != nil {
			w.log.Info("plan interrupted", "epoch", p.Epoch, "batches_done", st.batches, "reason", context.Cause(w.stopCtx))
			return nil
		}
		if w.pluginLost(pluginhost.Trainer, err) {
			if w.ovl != nil {
				if aerr := w.abortOverlap(ctx, err); aerr != nil {
					return aerr
				}
			}
			// The plan ends here, without Metrics: the coordinator gives
			// back what its reports do not cover.
			w.log.Warn("plan lost with the trainer", "epoch", p.Epoch, "offset", p.PartitionOffset, "size", p.PartitionSize, "batches_done", st.batches)
			return w.replaceTrainer(ctx, err, &p)
		}
		return fmt.Errorf("train epoch %d, plan [%d, +%d): %w", p.Epoch, p.PartitionOffset, p.PartitionSize, err)
	}
	m := &wirepb.Metrics{
		RoundWaitMs:     plugin.Milliseconds(w.roundHeld),
		Rank:            w.o.Rank,
		Epoch:           p.Epoch,
		Batches:         st.batches,
		Samples:         st.samples,
		EpochMs:         plugin.Milliseconds(elapsed),
		ComputeMs:       st.computeMS,
		DataMs:          st.dataMS,
		Resources:       w.lastSample.Load(),
		PartitionOffset: p.PartitionOffset,
		PartitionSize:   p.PartitionSize,
		Scalars:         st.scalars.sums,
	}
	if st.batches > 0 {
		m.AvgLoss = st.loss / float64(st.batches)
	}
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
		w.log.Warn("epoch callback failed", "epoch", epoch, "error", err)
	}
	return w.send(ctx, &wirepb.EpochFnElapsed{Rank: w.o.Rank, Epoch: epoch, ElapsedMs: plugin.Milliseconds(time.Since(start))})
}

// round runs one averaging round (docs/protocol.md, "Averaging rounds").
// A round that failed because a peer died (or because the worker is
// stopping, or because the averager says so with plugin.ErrRoundAborted) is
// acknowledged as aborted and the worker carries on; any other averaging
// failure ends the worker.
func (w *worker) round(ctx context.Context, m *wirepb.Sync) error {
	defer w.holdTraining(time.Now())
	rr, err := w.beginRound(ctx, m)
	if rr == nil || err != nil {
		return err
	}
	return w.endRound(ctx, rr, w.average(w.stopCtx, rr))
}

// roundRun is a round between its Publish and its Adopt.
type roundRun struct {
	m       *wirepb.Sync
	n       uint64
	start   time.Time
	ack     *wirepb.SyncAck
	req     plugin.Round
	members []uint32 // the session's, as the round began
}

// roundOutcome is what the averager made of a round.
type roundOutcome struct {
	res       plugin.RoundResult
	err       error
	abortedBy error // why the watchdog aborted it, if it did
}

// beginRound applies a pending session, publishes the parameters and
// builds the averager's request. A nil roundRun with a nil error means the
// round is already over (acknowledged as aborted).
func (w *worker) beginRound(ctx context.Context, m *wirepb.Sync) (*roundRun, error) {
	start := time.Now()
	n := m.GetRound()
	if p := m.GetNextPlan(); p != nil {
		w.held = append(w.held, p)
	}
	if s := w.mailbox.take(); s != nil {
		aborts := w.guard.aborts()
		if err := w.averager.NewSession(ctx, *s); err != nil {
			if !w.pluginLost(pluginhost.Averager, err) {
				return nil, fmt.Errorf("round %d: apply averaging session generation %d: %w", n, s.Generation, err)
			}
			// The coordinator answers the replacement with a new session.
			if err := w.replaceAverager(ctx, err); err != nil {
				return nil, err
			}
			return nil, w.abortedAck(ctx, &wirepb.SyncAck{Rank: w.o.Rank, Round: n}, start, fmt.Errorf("%w: the averager was replaced", plugin.ErrRoundAborted))
		}
		w.members, w.sessionAborts = slices.Clone(s.Members), aborts
		w.log.Info("averaging session applied", "generation", s.Generation, "members", s.Members, "new_rank", s.NewRank)
	}
	var pub plugin.PublishResult
	var err error
	if w.training {
		// Train runs: a replacement trainer cannot be started under it.
		// Training goes on; the batches report what this held them.
		pub, err = w.trainer.Publish(ctx)
	} else {
		err = w.onTrainer(ctx, func(t plugin.Trainer) (err error) {
			pub, err = t.Publish(ctx)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("round %d: publish parameters: %w", n, err)
	}
	w.pendingSteps += pub.Steps
	if err := w.send(ctx, &wirepb.SnapshotReady{Rank: w.o.Rank, Round: n}); err != nil {
		return nil, err
	}
	rr := &roundRun{m: m, n: n, start: start,
		ack: &wirepb.SyncAck{Rank: w.o.Rank, Round: n, StepCount: pub.StepCount, PreNorm: &pub.ParamNorm, HostCopyBytes: pub.HostCopyBytes},
		req: plugin.Round{Round: n, Steps: w.pendingSteps}, members: slices.Clone(w.members)}
	if m.GetMode() == wirepb.SyncMode_SYNC_MODE_BROADCAST {
		// Sync names the root by global rank; the averager counts in the
		// session's ranks.
		idx := slices.Index(w.members, m.GetRoot())
		if idx < 0 {
			return nil, w.abortedAck(ctx, rr.ack, start, fmt.Errorf("broadcast root %d is not a member of the session %v", m.GetRoot(), w.members))
		}
		rr.req.Broadcast, rr.req.Root = true, uint32(idx)
	}
	w.log.Debug("round begins", "round", n, "steps", rr.req.Steps, "broadcast", rr.req.Broadcast)
	return rr, nil
}

// average runs the averager's part of rr. It may run on a goroutine of its
// own while the rank trains (overlapped rounds): it touches only the
// averager, the guard and the ledger.
func (w *worker) average(parent context.Context, rr *roundRun) roundOutcome {
	// A stop ends the round too: the coordinator gives up on a stalled
	// round with ShutdownWithSave, which this rank must get to.
	rctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	w.guard.begin(cancel)
	var out roundOutcome
	// Checked after begin, so a death either shows here or reaches the
	// round through the watchdog: a peer that died while this rank was
	// training would otherwise be waited for forever.
	if dead := w.ledger.deadAmong(rr.members); len(dead) > 0 {
		out.err = fmt.Errorf("%w: session members %v are dead", errPeerDied, dead)
	} else {
		out.res, out.err = w.averager.Average(rctx, rr.req)
	}
	out.abortedBy = w.guard.end()
	return out
}

// endRound takes the averaged parameters and acknowledges the round.
func (w *worker) endRound(ctx context.Context, rr *roundRun, o roundOutcome) error {
	n, ack, start, err := rr.n, rr.ack, rr.start, o.err
	if err != nil && w.pluginLost(pluginhost.Averager, err) {
		// The new averager knows no session: the coordinator re-forms the
		// group and runs the round again.
		if rerr := w.replaceAverager(ctx, err); rerr != nil {
			return rerr
		}
		return w.abortedAck(ctx, ack, start, err)
	}
	if err != nil {
		if o.abortedBy == nil && !errors.Is(err, errPeerDied) && !errors.Is(err, plugin.ErrRoundAborted) && w.guard.aborts() == w.sessionAborts && w.stopCtx.Err() == nil {
			return fmt.Errorf("averaging round %d: %w", n, err)
		}
		return w.abortedAck(ctx, ack, start, err)
	}

	alpha := w.o.EASGDAlpha
	if rr.req.Broadcast {
		alpha = 0 // every rank must take the root's values exactly
	}
	var norm float64
	if w.training {
		norm, err = w.trainer.Adopt(ctx, alpha)
		if err != nil && w.pluginLost(pluginhost.Trainer, err) {
			// The trainer died taking a round that ran beside its Train:
			// the coordinator must hear of the round before the plan's
			// loss (Train's end replaces the trainer), or it waits for
			// this rank's SyncAck for ever.
			if aerr := w.abortedAck(ctx, ack, start, fmt.Errorf("%w: %v", errRoundLostTrainer, err)); aerr != nil {
				return aerr
			}
			return fmt.Errorf("round %d: adopt averaged parameters: %w", n, err)
		}
	} else {
		err = w.onTrainer(ctx, func(t plugin.Trainer) (err error) {
			norm, err = t.Adopt(ctx, alpha)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("round %d: adopt averaged parameters: %w", n, err)
	}
	w.pendingSteps = 0
	// The plans the Sync brought start now, with the step count it carried,
	// not after a round trip for Update.
	if gs := rr.m.GlobalStep; gs != nil {
		w.globalStep, w.stepFresh = *gs, true
	}
	for _, p := range w.held {
		w.queuePlan(p)
	}
	w.held = nil
	w.prof.rounds++
	w.prof.lastAdopt = time.Now()
	res := o.res
	div := res.Divergence
	w.divergence = &div
	ack.Divergence = &div
	ack.PostNorm = &norm
	ack.Weight, ack.TotalWeight = res.Weight, res.TotalWeight
	ack.BytesMoved = res.BytesMoved
	ack.HostCopyBytes += res.HostCopyBytes
	ack.RoundMs = plugin.Milliseconds(time.Since(start))
	w.log.Debug("round done", "round", n, "weight", res.Weight, "total_weight", res.TotalWeight, "divergence", div, "ms", ack.RoundMs)
	return w.send(ctx, ack)
}

func (w *worker) abortedAck(ctx context.Context, ack *wirepb.SyncAck, start time.Time, why error) error {
	w.log.Warn("averaging round aborted", "round", ack.GetRound(), "reason", why)
	ack.Aborted, ack.Error = true, why.Error()
	ack.RoundMs = plugin.Milliseconds(time.Since(start))
	return w.send(ctx, ack)
}

// send writes one frame, naming it in the error.
func (w *worker) send(ctx context.Context, msg proto.Message) error {
	if err := w.conn.Send(ctx, msg); err != nil {
		return fmt.Errorf("send %s: %w", msg.ProtoReflect().Descriptor().Name(), err)
	}
	return nil
}

func isShutdown(m proto.Message) bool {
	_, ok := m.(*wirepb.Shutdown)
	return ok
}

func isShutdownWithSave(m proto.Message) bool {
	_, ok := m.(*wirepb.ShutdownWithSave)
	return ok
}

// holdTraining adds the time since start to what rounds held training.
func (w *worker) holdTraining(start time.Time) { w.roundHeld += time.Since(start) }

// epochEnd runs the trainer's end-of-epoch code, where it has any, and
// reports its time (which is not batch time).
func (w *worker) epochEnd(ctx context.Context, epoch uint64) error {
	e, ok := w.trainer.(plugin.EpochEnder)
	if !ok {
		return nil
	}
	start := time.Now()
	ran, err := e.EpochEnd(ctx, epoch)
	if err != nil {
		if w.pluginLost(pluginhost.Trainer, err) {
			return w.replaceTrainer(ctx, err, nil)
		}
		// User code failing at an epoch's end costs the run nothing it has
		// trained: say so and go on, as a failed evaluation does.
		w.log.Warn("the trainer's end-of-epoch code failed", "epoch", epoch, "error", err)
		return nil
	}
	if !ran {
		return nil
	}
	w.log.Debug("end-of-epoch code ran", "epoch", epoch, "ms", plugin.Milliseconds(time.Since(start)))
	return w.send(ctx, &wirepb.EpochFnElapsed{Rank: w.o.Rank, Epoch: epoch, ElapsedMs: plugin.Milliseconds(time.Since(start))})
}
