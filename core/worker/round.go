package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

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
	return w.endRound(ctx, rr, w.average(w.connCtx, rr))
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
		w.plans.hold(p)
	}
	if s := w.mailbox.take(); s != nil {
		aborts := w.guard.aborts()
		if err := w.sup.Averager().NewSession(ctx, *s); err != nil {
			lost, rerr := w.sup.Recover(ctx, pluginhost.Averager, err, nil)
			if !lost {
				return nil, fmt.Errorf("round %d: apply averaging session generation %d: %w", n, s.Generation, err)
			}
			// The coordinator answers the replacement with a new session.
			if rerr != nil {
				return nil, rerr
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
		pub, err = w.sup.Trainer().Publish(ctx)
	} else {
		err = w.sup.WithTrainer(ctx, func(t plugin.Trainer) (err error) {
			pub, err = t.Publish(ctx)
			return err
		})
	}
	if err != nil {
		err = fmt.Errorf("round %d: publish parameters: %w", n, err)
		if w.training && w.sup.Lost(pluginhost.Trainer, err) {
			// Train replaces the trainer once this returns; the round
			// goes on without it (partakeLost).
			if aerr := w.partakeLost(ctx, m, start, err); aerr != nil {
				return nil, aerr
			}
		}
		return nil, err
	}
	w.pendingSteps += pub.Steps
	w.held.publish(pub.StepCount)
	if err := w.send(ctx, &wirepb.SnapshotReady{Rank: w.o.Rank, Round: n}); err != nil {
		return nil, err
	}
	rr, err := w.roundRequest(m, start, &wirepb.SyncAck{Rank: w.o.Rank, Round: n, StepCount: pub.StepCount, PreNorm: &pub.ParamNorm, HostCopyBytes: pub.HostCopyBytes}, w.pendingSteps)
	if err != nil {
		return nil, w.abortedAck(ctx, rr.ack, start, err)
	}
	w.log.Debug("round begins", "round", n, "steps", rr.req.Steps, "broadcast", rr.req.Broadcast)
	return rr, nil
}

// roundRequest is m's round as the averager is asked it, with steps
// trained since the last round; an error says why it cannot run here.
func (w *worker) roundRequest(m *wirepb.Sync, start time.Time, ack *wirepb.SyncAck, steps uint64) (*roundRun, error) {
	rr := &roundRun{m: m, n: m.GetRound(), start: start, ack: ack,
		req: plugin.Round{Round: m.GetRound(), Steps: steps}, members: slices.Clone(w.members)}
	if m.GetMode() == wirepb.SyncMode_SYNC_MODE_BROADCAST {
		// Sync names the root by global rank; the averager counts in the
		// session's ranks.
		idx := slices.Index(w.members, m.GetRoot())
		if idx < 0 {
			return rr, fmt.Errorf("broadcast root %d is not a member of the session %v", m.GetRoot(), w.members)
		}
		rr.req.Broadcast, rr.req.Root = true, uint32(idx)
	}
	return rr, nil
}

// partakeLost is this rank's part in m's round when the trainer was lost
// (lost, the error) before it published: the peers' averagers wait in the
// round for this rank's, and only a death or a stop would end their wait.
// The averager takes part with the arena as it is (the last round's
// values) at no weight, so the round adds nothing of this rank's, and the
// round is acknowledged as aborted: the coordinator runs it again.
func (w *worker) partakeLost(ctx context.Context, m *wirepb.Sync, start time.Time, lost error) error {
	ack := &wirepb.SyncAck{Rank: w.o.Rank, Round: m.GetRound()}
	why := fmt.Errorf("%w: %v", errRoundLostTrainer, lost)
	rr, err := w.roundRequest(m, start, ack, 0)
	if err == nil {
		if out := w.average(w.connCtx, rr); out.err != nil {
			w.log.Debug("averaging without the lost trainer failed", "round", rr.n, "error", out.err)
		}
	}
	return w.abortedAck(ctx, ack, start, why)
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
		out.res, out.err = w.sup.Averager().Average(rctx, rr.req)
	}
	out.abortedBy = w.guard.end()
	return out
}

// endRound takes the averaged parameters and acknowledges the round.
func (w *worker) endRound(ctx context.Context, rr *roundRun, o roundOutcome) error {
	n, ack, start, err := rr.n, rr.ack, rr.start, o.err
	if lost, rerr := w.sup.Recover(ctx, pluginhost.Averager, err, nil); lost {
		// The new averager knows no session: the coordinator re-forms the
		// group and runs the round again.
		if rerr != nil {
			return rerr
		}
		return w.abortedAck(ctx, ack, start, err)
	}
	if err != nil {
		if o.abortedBy == nil && !errors.Is(err, errPeerDied) && !errors.Is(err, plugin.ErrRoundAborted) && w.guard.aborts() == w.sessionAborts && !w.linkLostSoon() {
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
		norm, err = w.sup.Trainer().Adopt(ctx, alpha)
		if w.sup.Lost(pluginhost.Trainer, err) {
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
		err = w.sup.WithTrainer(ctx, func(t plugin.Trainer) (err error) {
			norm, err = t.Adopt(ctx, alpha)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("round %d: adopt averaged parameters: %w", n, err)
	}
	w.pendingSteps = 0
	w.held.consensus(n)
	w.plans.roundDone(rr.m.GlobalStep)
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

// linkLostSoon reports whether the control link is lost now or within
// linkLossGrace. An averager that failed may have lost a meeting point
// that lives in the coordinator (averaging-cpu's reduce server): a killed
// coordinator's sockets all close at once, and the averager's can be read
// before the control link's. Such a round is aborted, and the rank waits
// for the coordinator to come back, rather than dying of it.
func (w *worker) linkLostSoon() bool {
	t := time.NewTimer(linkLossGrace)
	defer t.Stop()
	select {
	case <-w.connCtx.Done():
		return true
	case <-t.C:
		return false
	}
}

// linkLossGrace is how long a failed round waits to learn that the
// control link went with it: a killed coordinator's sockets close within
// microseconds of each other, a loaded machine's reader may take longer
// to be scheduled.
const linkLossGrace = time.Second

func (w *worker) abortedAck(ctx context.Context, ack *wirepb.SyncAck, start time.Time, why error) error {
	w.log.Warn("averaging round aborted", "round", ack.GetRound(), "reason", why)
	ack.Aborted, ack.Error = true, why.Error()
	ack.RoundMs = plugin.Milliseconds(time.Since(start))
	return w.send(ctx, ack)
}

// holdTraining adds the time since start to what rounds held training.
func (w *worker) holdTraining(start time.Time) { w.roundHeld += time.Since(start) }
