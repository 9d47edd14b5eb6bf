package dispatch

import (
	"fmt"
	"math"

	"github.com/cohortdl/cohort/core/status"
)

// RoundIssued notes a round's Sync going out to the live ranks: it
// releases the throttled ones, and what each has trained so far is what
// the round averages (average), or what it already averaged in the round
// a broadcast re-runs.
func (d *Dispatcher) RoundIssued(live []uint32, average bool) {
	for _, id := range live {
		q := &d.queues[id]
		q.throttled = false // the Sync releases it
		q.since = q.sinceRound
		if average {
			q.published = len(q.unaveraged)
		}
	}
}

// Averaged notes that rank's part of the round in flight succeeded: the
// batches it averaged are behind it, and it starts what it held for the
// round.
func (d *Dispatcher) Averaged(rank uint32) {
	q := &d.queues[rank]
	q.sinceRound -= min(q.since, q.sinceRound)
	for _, p := range q.outstanding {
		p.held = false
	}
}

// RoundDone folds a completed round (not round 0) into the controller and
// the cadence: num is the round, epoch its epoch from 1, ms its time
// from Sync to the last SyncAck, divs the divergence each live rank that
// trained reported, in rank order (so their mean is the same in a resumed
// run), and average whether it averaged (a broadcast tells nothing of
// divergence).
func (d *Dispatcher) RoundDone(num, epoch uint64, ms float64, divs []float64, average bool) {
	if average {
		d.ctl.observeRound(num, epoch, divs)
	}
	if d.cad != nil && d.lastWindowMS > 0 {
		if from, ok := d.cad.observeWindow(ms, d.lastWindowMS, d.ctl.verdict()); ok {
			rule := RuleOverhead
			if d.cad.base < from {
				rule = RuleTighten
			}
			lr := d.ctl.lrScale()
			d.ctl.decide(ControllerDecision{Round: num, Epoch: epoch, Rule: rule,
				Divergence: d.ctl.st.DivergenceEMA, From: from, To: d.cad.base, LRFrom: lr, LRTo: lr})
		}
		d.lastWindowMS = 0
	}
}

// EvalLoss applies the plateau rule to an epoch's eval loss; round is the
// next round's number, epoch the evaluated epoch from 1.
func (d *Dispatcher) EvalLoss(round, epoch uint64, loss float64) {
	d.ctl.observeEval(round, epoch, loss)
}

// Unsynced is the number of batches the live ranks trained since their
// last completed round.
func (d *Dispatcher) Unsynced(live []uint32) uint64 {
	var n uint64
	for _, id := range live {
		n += d.queues[id].sinceRound
	}
	return n
}

// AsyncRoundDue: the slowest busy rank has trained the controller's
// interval since the last round, or every busy rank is throttled (only the
// round's Sync releases them).
func (d *Dispatcher) AsyncRoundDue(live []uint32) bool {
	slowest := uint64(math.MaxUint64)
	allThrottled := true
	for _, id := range live {
		if q := &d.queues[id]; len(q.outstanding) > 0 {
			slowest = min(slowest, q.sinceRound)
			allThrottled = allThrottled && q.throttled
		}
	}
	return slowest != math.MaxUint64 && (slowest >= d.ctl.st.Interval || allThrottled)
}

// throttleAhead parks rank (async, coordinator.max_batch_diff) when it has
// trained more than max_batch_diff batches beyond the slowest busy rank
// since the last round: its next plans wait for the round, so no rank's
// model runs far ahead of the average it will be folded into. It reports
// whether the rank must be sent Throttle.
func (d *Dispatcher) throttleAhead(rank uint32, live []uint32, inRound bool) bool {
	limit := uint64(d.cfg.Coordinator.MaxBatchDiff)
	q := &d.queues[rank]
	if d.Windowed() || limit == 0 || q.throttled || inRound {
		return false
	}
	slowest := uint64(math.MaxUint64)
	for _, id := range live {
		if o := &d.queues[id]; id != rank && len(o.outstanding) > 0 {
			slowest = min(slowest, o.sinceRound)
		}
	}
	if slowest == math.MaxUint64 || q.sinceRound <= slowest+limit {
		return false
	}
	q.throttled = true
	d.ctl.throttles++
	d.log.Debug("throttled a rank ahead of the slowest", "rank", rank, "since_round", q.sinceRound,
		"slowest", slowest, "max_batch_diff", limit)
	return true
}

// logDecision logs a controller decision.
func (d *Dispatcher) logDecision(c ControllerDecision) {
	d.log.Info("controller: "+c.Rule, "round", c.Round, "epoch", c.Epoch, "divergence", c.Divergence,
		"eval_loss", c.EvalLoss, "interval", fmt.Sprintf("%d -> %d", c.From, c.To),
		"lr_scale", fmt.Sprintf("%g -> %g", c.LRFrom, c.LRTo))
}

// ControllerSummary is the controller's account; under cadence the
// interval is the window's base, which the cadence sizes.
func (d *Dispatcher) ControllerSummary() *ControllerSummary {
	s := d.ctl.summary()
	if d.cad != nil {
		s.Interval = d.cad.base
	}
	return s
}

// LiveController is the controller for the status page: what is in force
// and its last decisions.
func (d *Dispatcher) LiveController() status.Controller { return d.ctl.live() }

// CadenceState is the cadence's state for a checkpoint; nil unless the
// policy is cadence.
func (d *Dispatcher) CadenceState() *CadenceState {
	if d.cad == nil {
		return nil
	}
	return d.cad.state()
}

// Settle counts everything rank trained as averaged: a solo rank's
// batches, which no round averages.
func (d *Dispatcher) Settle(rank uint32) {
	q := &d.queues[rank]
	q.sinceRound, q.unaveraged, q.published = 0, nil, 0
}

// ControllerState is the controller's state as of now, for a checkpoint.
func (d *Dispatcher) ControllerState() ControllerState { return d.ctl.state() }
