package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker/link"
	"github.com/cohortdl/cohort/shared/plugin"
)

// A rank outlives the coordinator it loses, for a while: a coordinator
// restarted with --resume on the same address takes it back. What the
// rank keeps and what it drops is docs/protocol.md's "A coordinator that
// comes back"; this file is the rank's side of it.
//
// While the link is lost the rank trains nothing: the plan under way is
// interrupted (its reported batches stay in the model), a round in flight
// is aborted, and every command the lost coordinator queued is dropped
// with its plans. The plugins, their arena and the model stay. The rank
// redials for up to its liveness timeout; a coordinator that answers with
// a comeback Admit gets Ready.kept: the last round that succeeded here and
// what the rank trained since it published into that round (heldWork),
// which only this model holds. Nothing else of the lost coordinator's
// state is needed: the new one decides from those and its consensus file.

// heldWork is what the rank trained since it published into its last
// successful round, in training order: the spans its Batch reports cover
// (spans) and how many of them it published into the round in flight
// (published). It belongs to the main loop's goroutine.
type heldWork struct {
	spans     []*wirepb.Span
	published int
	lastRound uint64
	// steps is the trainer's step count as last heard (a batch report or
	// a Publish), when heard; cut is the plan the lost link interrupted.
	steps uint64
	heard bool
	cut   *cutPlan
}

// cutPlan is a plan the lost link interrupted and the samples its
// reports covered.
type cutPlan struct {
	plan     plugin.Plan
	reported uint64
}

// stepped records the trainer's step count from a report or a Publish.
func (h *heldWork) stepped(count uint64) { h.steps, h.heard = count, true }

// unreported adds the batches of the cut plan that the trainer finished
// beyond its reports: stepCount is the trainer's count now, batch its
// batch size. A plugin's report in flight when the link's loss cancels
// Train is lost; its step is in the model.
func (h *heldWork) unreported(stepCount, batch uint64) (added uint64) {
	c := h.cut
	h.cut = nil
	missed := uint64(0)
	if h.heard && stepCount > h.steps {
		missed = stepCount - h.steps
	}
	h.stepped(stepCount)
	if c == nil || batch == 0 {
		return 0
	}
	for from := c.reported; missed > 0 && from < c.plan.PartitionSize; missed-- {
		n := min(batch, c.plan.PartitionSize-from)
		h.note(c.plan, from, n)
		from += n
		added += n
	}
	return added
}

// note records that a batch report covered n more samples of p, from its
// from-th.
func (h *heldWork) note(p plugin.Plan, from, n uint64) {
	if n == 0 {
		return
	}
	at := p.PartitionOffset + from
	if k := len(h.spans); k > h.published {
		if last := h.spans[k-1]; last.Epoch == p.Epoch && last.Offset+last.Size == at {
			last.Size += n
			last.Batches++
			return
		}
	}
	h.spans = append(h.spans, &wirepb.Span{Epoch: p.Epoch, Offset: at, Size: n, Batches: 1})
}

// publish marks everything trained so far as published into the round
// that just took the model (Publish), the trainer at stepCount.
func (h *heldWork) publish(stepCount uint64) {
	h.published = len(h.spans)
	h.stepped(stepCount)
}

// consensus notes that round succeeded here: what the rank published into
// it is the cohort's now.
func (h *heldWork) consensus(round uint64) {
	h.spans = append([]*wirepb.Span(nil), h.spans[h.published:]...)
	h.published = 0
	h.lastRound = round
}

// kept is what Ready.kept says of this model.
func (h *heldWork) kept(runID string) *wirepb.Kept {
	return &wirepb.Kept{RunId: runID, LastRound: h.lastRound, Held: h.spans}
}

// errNoComeback wraps the loss that ended the worker when no coordinator
// came back in time.
var errNoComeback = errors.New("no coordinator came back")

// lostLink reports the loss of the current link, nil while it stands.
func (w *worker) lostLink() error {
	if w.connCtx.Err() == nil || w.stopCtx.Err() != nil {
		return nil
	}
	return context.Cause(w.connCtx)
}

// comeback waits for a coordinator to take this rank back after cause
// ended its link. It returns nil once the rank is Ready on a new link, or
// the error to exit with: the loss, when no coordinator came back within
// the liveness timeout (a silent coordinator has had it already) or one
// that answered cannot take this model.
func (w *worker) comeback(ctx context.Context, cause error) error {
	w.dropLink()
	if errors.Is(cause, ErrCoordinatorSilent) {
		return cause
	}
	start := time.Now()
	w.log.Warn("lost the coordinator; waiting for it to come back", "error", cause, "for", w.o.LivenessTimeout)
	l, admit, err := w.redial(ctx)
	if err != nil {
		return fmt.Errorf("%w within the liveness timeout (%v): %w; it was lost: %w", errNoComeback, w.o.LivenessTimeout, err, cause)
	}
	if err := w.rejoin(ctx, l, admit); err != nil {
		return fmt.Errorf("rejoin the coordinator that came back: %w", err)
	}
	w.log.Info("the coordinator came back; rank ready again", "run", admit.GetRunId(), "last_round", w.held.lastRound,
		"held_spans", len(w.held.spans), "waited", time.Since(start).Round(time.Millisecond))
	return nil
}

// dropLink ends everything of the lost link: the round beside training,
// the periodic senders and the reader, the link itself, the lost
// coordinator's commands and plans, and any session it sent.
func (w *worker) dropLink() {
	w.joinOverlap()
	w.samplerTask.stop()
	w.heartbeatTask.stop()
	w.inboundTask.stop()
	w.samplerTask, w.heartbeatTask, w.inboundTask = nil, nil, nil
	if err := w.link.Close(); err != nil {
		w.log.Debug("close the lost control link", "error", err)
	}
	for {
		if _, ok := w.queue.tryPop(); !ok {
			break
		}
	}
	w.plans.drop()
	w.mailbox.take()
}

// redial connects to the coordinator's address again and waits for its
// Admit, retrying (a dying coordinator's socket may still accept, then
// reset) until the liveness timeout.
func (w *worker) redial(ctx context.Context) (*link.Link, *wirepb.Admit, error) {
	dctx, cancel := context.WithTimeout(w.stopCtx, w.o.LivenessTimeout)
	defer cancel()
	for {
		l, err := link.Dial(dctx, w.linkConfig(w.o.LivenessTimeout, time.Second))
		if err == nil {
			var admit *wirepb.Admit
			if admit, err = l.AwaitAdmit(dctx); err == nil {
				return l, admit, nil
			}
			l.Close()
		}
		if dctx.Err() != nil {
			return nil, nil, err
		}
		w.log.Debug("the coordinator did not take this rank back yet", "error", err)
		t := time.NewTimer(redialPause)
		select {
		case <-t.C:
		case <-dctx.Done():
			t.Stop()
			return nil, nil, err
		}
	}
}

// redialPause separates attempts to rejoin that reached the coordinator's
// address but not its Admit.
const redialPause = 250 * time.Millisecond

// rejoin takes the new link in use: the reader and heartbeat on it, the
// averager at the new meeting point, then Ready with what the model
// holds. A coordinator that is not coming back for this run (a new run,
// or one that does not know the rank's run) is refused; one that resumes
// from a checkpoint without a comeback gets the checkpoint loaded into
// the running trainer.
func (w *worker) rejoin(ctx context.Context, l *link.Link, admit *wirepb.Admit) error {
	old := w.admit
	l.KeepRelay(w.link.Relay())
	w.link = l
	w.newConn()
	w.inboundTask = goTask(ctx, func(ctx context.Context) { w.link.Read(ctx, bridge{w}) })
	w.heartbeatTask = goTask(ctx, func(ctx context.Context) { w.link.Heartbeat(ctx, w.o.HeartbeatInterval) })
	var kept *wirepb.Kept
	var from string
	switch {
	case admit.GetComeback() && admit.GetRunId() == old.GetRunId():
		if err := w.keepUnreported(ctx); err != nil {
			return err
		}
		kept = w.held.kept(old.GetRunId())
	case admit.GetResumeDir() != "":
		var err error
		if from, err = resumeDir(admit.GetResumeDir(), w.o.Rank); err != nil {
			return err
		}
		if err := w.sup.Resume(ctx, from); err != nil {
			return err
		}
		w.held = heldWork{}
		w.pendingSteps = 0
	default:
		return fmt.Errorf("the coordinator at %s started run %s afresh; this rank holds run %s's model", w.o.Coordinator, admit.GetRunId(), old.GetRunId())
	}
	w.admit = admit
	endpoint, err := w.link.Relay().Meet(ctx, w.meetKind, w.o.Averager.Name)
	if err != nil {
		return err
	}
	if err := w.sup.Reconfigure(ctx, averagingEndpoint(endpoint, w.o.Coordinator), from, os.TempDir()); err != nil {
		return err
	}
	w.ledger.reset()
	w.members = newLoopState(w.o.World).members
	w.sessionAborts = w.guard.aborts()
	w.role, w.saved = nil, false
	if err := w.sendReady(ctx, kept); err != nil {
		return err
	}
	if w.o.ResourceInterval > 0 {
		w.samplerTask = goTask(ctx, func(ctx context.Context) { w.sampleResources(ctx, w.sampler) })
	}
	return nil
}

// keepUnreported counts into the held work the batches of the interrupted
// plan whose reports the lost link dropped. The trainer's step count,
// which Publish returns, says how many it finished; the next round
// publishes again and weighs the steps this Publish took in.
func (w *worker) keepUnreported(ctx context.Context) error {
	if w.held.cut == nil {
		return nil
	}
	var pub plugin.PublishResult
	err := w.sup.WithTrainer(ctx, func(t plugin.Trainer) (err error) {
		pub, err = t.Publish(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("publish to count the steps the lost link's reports missed: %w", err)
	}
	w.pendingSteps += pub.Steps
	if n := w.held.unreported(pub.StepCount, uint64(w.sup.Setup().BatchSize)); n > 0 {
		w.log.Info("the lost link dropped reports of trained batches; they are held", "samples", n, "step_count", pub.StepCount)
	}
	return nil
}
