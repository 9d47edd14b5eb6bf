package coordinator

import (
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Plugin kinds a PluginRestarted names.
const (
	pluginTrainer  = "trainer"
	pluginAverager = "averager"
)

// onPluginRestarted records a plugin the rank replaced with a fresh
// process: the rank lives on, so this is a membership-like event, not a
// death. A trainer lost in the middle of a plan gives back what its Batch
// reports do not cover, as a death would. A new averager knows no session
// and its old process may have left relay exchanges half-posted: those
// fail (so the peers' round aborts instead of waiting for a post that will
// not come) and the group is re-formed with the same members, so the round
// runs again on a session every averager applied.
func (r *runner) onPluginRestarted(rs *rankState, m *wirepb.PluginRestarted) {
	if rs.status != stLive {
		return
	}
	kind := m.GetKind()
	if kind != pluginTrainer && kind != pluginAverager {
		r.log.Warn("ignoring PluginRestarted for an unknown plugin kind", "rank", rs.id, "kind", kind)
		return
	}
	restarts := r.rep.PluginRestarted(rs.id)
	reason := fmt.Sprintf("%s plugin replaced (restart %d): %s", kind, restarts, m.GetReason())
	ev := record.MembershipEvent{Rank: rs.id, Event: record.EventPluginRestarted, Epoch: r.epoch + 1, Reason: reason, Time: time.Now()}
	r.rep.Member(ev)
	r.log.Warn("rank replaced a plugin", "rank", rs.id, "kind", kind, "restarts", restarts,
		"reason", m.GetReason(), "phase", r.phase.String())
	r.emit(Progress{Kind: ProgressMembership, Event: &ev})

	switch kind {
	case pluginTrainer:
		if m.GetPlanLost() {
			r.giveBackLostPlan(rs, m)
		}
	case pluginAverager:
		r.meet.FailAll(fmt.Sprintf("rank %d replaced its averager: %s", rs.id, m.GetReason()))
		if r.phase == phTraining {
			r.requestSession(r.live())
		}
	}
}

// giveBackLostPlan takes back the plan a replaced trainer was training:
// its Batch reports count as trained (as a departed rank's do) and the
// rest goes to the live ranks, this one included, as ExtendPartition. The
// rank sends no Metrics for it.
func (r *runner) giveBackLostPlan(rs *rankState, m *wirepb.PluginRestarted) {
	u, trained, ok := r.disp.TakeBack(rs.id, m.GetEpoch(), m.GetPartitionOffset(), m.GetPartitionSize())
	if !ok {
		r.log.Warn("PluginRestarted names a plan the rank does not hold", "rank", rs.id,
			"epoch", m.GetEpoch(), "offset", m.GetPartitionOffset(), "size", m.GetPartitionSize())
		return
	}
	r.rep.Unclosed(trained)
	if u.Size > 0 && r.phase == phTraining {
		r.redistribute([]dispatch.Range{u}, r.live())
	}
}
