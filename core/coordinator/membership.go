package coordinator

import (
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/membership"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// What a change of the cohort means for the run: its formation, a rank's
// departure, a plugin a rank replaced. Who is in the cohort, liveness and
// the re-formation of the averaging group are package membership's.

// tryForm forms the cohort once every rank is Ready.
func (r *runner) tryForm() bool {
	if !r.ranks.AllReady() {
		return false
	}
	ref := r.ranks.ReadyOf(0)
	r.pickSpace = ref.GetSamples()
	r.batch = uint64(ref.GetBatchSize())
	r.ranks.Form()
	mode, root := wirepb.SyncMode_SYNC_MODE_BROADCAST, uint32(0)
	if r.c.comeback != nil {
		r.cb = r.planComeback()
		if r.cb.state != nil {
			// The consensus stands in for the checkpoint from here on;
			// startTraining adds what the first round brings.
			r.c.meta = r.cb.state
		}
		mode, root = r.cb.firstRound()
	}
	if m := r.c.meta; m != nil && m.PickSpace != r.pickSpace {
		r.finish(record.StatusFailed, fmt.Errorf("coordinator: resume: checkpoint %s was taken with %d samples, the trainer now has %d",
			r.c.resume, m.PickSpace, r.pickSpace))
		return true
	}
	r.phase = phTraining
	r.log.Info("cohort formed", "ranks", r.world, "samples", r.pickSpace, "batch_size", r.batch,
		"trainer", ref.GetTrainer(), "averager", ref.GetAverager(), "adaptive_optimizer", ref.GetAdaptiveOptimizer(),
		"seconds", time.Since(r.started).Seconds())
	var cad *dispatch.CadenceState
	epoch := uint64(1)
	if m := r.c.meta; m != nil {
		cad = m.Cadence
		epoch = m.Epoch + 1 // the resumed epoch is restored after formation
	}
	r.disp.Form(r.pickSpace, r.batch, ref.GetAdaptiveOptimizer(), cad)
	r.emit(Progress{Kind: ProgressFormed})
	r.role.Form(epoch)
	if r.cb != nil && r.continueWindow() {
		return true
	}
	// Every rank starts from rank 0's parameters (after a resume: from
	// what rank 0 loaded; after a comeback: from the kept models).
	r.issueRound(mode, root, true)
	return true
}

// depart removes a live rank from the cohort: record the event, tell the
// survivors (DeclareDead: their watchdog aborts a round waiting on it),
// re-elect the epoch-callback rank, give its unfinished samples to the
// survivors, and re-form the averaging group; below min_ranks survivors,
// save and stop instead.
func (r *runner) depart(id uint32, event, reason string, status membership.Status) {
	// A coordinator restarted from here on must not wait for this rank.
	defer r.consensusNow(nil)
	r.ranks.Leave(id, status)
	r.rep.Left(id, reason)
	ev := record.MembershipEvent{Rank: id, Event: event, Epoch: r.epoch + 1, Reason: reason, Time: time.Now()}
	r.log.Warn("rank removed from the cohort", "rank", id, "event", event, "reason", reason,
		"epoch", r.epoch+1, "phase", r.phase.String())
	r.emit(Progress{Kind: ProgressMembership, Event: &ev})
	r.rep.Member(ev)
	r.meet.Dead(id, reason)
	// Its work back: what it trained since the last round that averaged
	// its work (its model alone held it), the part of each open plan no
	// Batch report covers, then its undispatched partition. Only what a
	// round took from it counts as trained.
	unfinished, trained, lost := r.disp.Forfeit(id)
	for _, t := range trained {
		r.rep.Unclosed(t)
	}
	r.rep.Lost(id, lost)
	survivors := r.ranks.Live()
	var death *record.DeathRecord
	if status == membership.Dead {
		death = r.rep.NewDeath(ev, r.phase.String(), unfinished)
		// Kept when depart returns, whichever way it ends.
		defer r.rep.KeepDeath(death)
	}

	switch r.phase {
	case phShutdown:
		return
	case phSaving:
		if r.save != nil {
			r.save.Gone(id)
			r.settleCkpt(r.save)
		}
		return
	case phExport:
		if r.export.RankGone(id) {
			r.shutdown()
		}
		return
	}

	if len(survivors) == 0 {
		r.finish(record.StatusFailed, fmt.Errorf("coordinator: every rank is lost (last: rank %d, %s)", id, reason))
		return
	}
	dd := &wirepb.DeclareDead{Rank: id, Reason: reason}
	for _, s := range survivors {
		r.ranks.Send(s, dd)
	}
	r.role.RankGone(r.epoch, id, survivors)
	if rd := r.round; rd != nil {
		delete(rd.waiting, id)
		delete(rd.acks, id)
	}

	if min := r.cfg.Coordinator.MinRanks; len(survivors) < min {
		r.log.Error("too few ranks left to carry on; saving and stopping", "live", len(survivors), "min_ranks", min)
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_TOO_FEW_RANKS, checkpoint.ReasonTooFewRanks, record.StatusFailed,
			fmt.Errorf("coordinator: %d live ranks after rank %d was lost (%s), min_ranks is %d", len(survivors), id, reason, min))
		return
	}
	handed := r.redistribute(unfinished, survivors)
	if death != nil {
		death.Redistributed = handed
	}
	r.sessions.Request(survivors)
	// Whatever waited on the lost rank can move on now; last, since each
	// may advance the run (to the next epoch, or the next window).
	if r.role.Evaluating(id) {
		r.role.Evaluate(r.epoch)
	}
	if r.ckpt != nil {
		r.ckpt.Gone(id)
		r.settleCkpt(r.ckpt)
	}
	r.checkRound()
}

// redistribute hands the ranges to the survivors in equal consecutive
// shares, each piece one ExtendPartition (and one plan) of its own, and
// returns the pieces.
func (r *runner) redistribute(rs []dispatch.Range, survivors []uint32) []dispatch.Handoff {
	handed := r.disp.Extend(rs, survivors)
	for _, h := range handed {
		r.ranks.Send(h.Rank, &wirepb.ExtendPartition{Epoch: r.epoch, PartitionOffset: h.Offset, PartitionSize: h.Size})
	}
	return handed
}

// Plugin kinds a PluginRestarted names.
const (
	pluginTrainer  = "trainer"
	pluginAverager = "averager"
)

// onPluginRestarted records a plugin the rank replaced with a fresh
// process: the rank lives on, so this is a membership-like event, not a
// death. A trainer lost in the middle of a plan gives back what its Batch
// reports do not cover, as a death would: they count as trained (as a
// departed rank's do) and the rest goes to the live ranks, this one
// included, as ExtendPartition; the rank sends no Metrics for it. A new
// averager knows no session and its old process may have left relay
// exchanges half-posted: those fail (so the peers' round aborts instead of
// waiting for a post that will not come) and the group is re-formed with
// the same members, so the round runs again on a session every averager
// applied.
func (r *runner) onPluginRestarted(id uint32, m *wirepb.PluginRestarted) {
	if r.ranks.Status(id) != membership.Live {
		return
	}
	kind := m.GetKind()
	if kind != pluginTrainer && kind != pluginAverager {
		r.log.Warn("ignoring PluginRestarted for an unknown plugin kind", "rank", id, "kind", kind)
		return
	}
	restarts := r.rep.PluginRestarted(id)
	reason := fmt.Sprintf("%s plugin replaced (restart %d): %s", kind, restarts, m.GetReason())
	ev := record.MembershipEvent{Rank: id, Event: record.EventPluginRestarted, Epoch: r.epoch + 1, Reason: reason, Time: time.Now()}
	r.rep.Member(ev)
	r.log.Warn("rank replaced a plugin", "rank", id, "kind", kind, "restarts", restarts,
		"reason", m.GetReason(), "phase", r.phase.String())
	r.emit(Progress{Kind: ProgressMembership, Event: &ev})

	switch kind {
	case pluginTrainer:
		if !m.GetPlanLost() {
			return
		}
		u, trained, ok := r.disp.TakeBack(id, m.GetEpoch(), m.GetPartitionOffset(), m.GetPartitionSize())
		if !ok {
			r.log.Warn("PluginRestarted names a plan the rank does not hold", "rank", id,
				"epoch", m.GetEpoch(), "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
			return
		}
		r.rep.Unclosed(trained)
		if u.Size > 0 && r.phase == phTraining {
			r.redistribute([]dispatch.Range{u}, r.ranks.Live())
		}
	case pluginAverager:
		r.meet.FailAll(fmt.Sprintf("rank %d replaced its averager: %s", id, m.GetReason()))
		if r.phase == phTraining {
			r.sessions.Request(r.ranks.Live())
		}
	}
}
