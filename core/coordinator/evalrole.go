package coordinator

import (
	"slices"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// roleHysteresis: under eval_rank = fastest the role moves only to a rank
// whose batch time is at most this share of the holder's (10% faster), so
// ranks of about the same speed do not trade it back and forth on jitter.
const roleHysteresis = 0.9

// formRole gives the role to eval_rank's pick when the cohort forms: the
// fixed rank, else the lowest (nobody has a batch time yet).
func (r *runner) formRole() {
	r.role = r.pickRole(r.live())
	epoch := uint64(1)
	if m := r.c.meta; m != nil {
		epoch = m.Epoch + 1 // the resumed epoch is restored after formation
	}
	r.noteRole(epoch, record.RoleFormed)
	r.log.Info("eval role assigned", "rank", r.role, "eval_rank", r.cfg.Coordinator.EvalRank)
	r.broadcast(&wirepb.SetEpochCallbackRole{Rank: r.role})
}

// electRole runs at an epoch's end, before its evaluation: under
// eval_rank = fastest, once every live rank has a batch time, the fastest
// takes the role if it beats the holder by the hysteresis margin. The other
// policies' holder only changes when it leaves (roleRankGone).
func (r *runner) electRole() {
	if r.cfg.Coordinator.EvalRank != config.EvalRankFastest {
		return
	}
	best, ok := r.fastest(r.live())
	holderMS, bestMS := r.disp.BatchMS(r.role), r.disp.BatchMS(best)
	if !ok || best == r.role || bestMS > roleHysteresis*holderMS {
		return
	}
	r.moveRole(best, record.RoleFaster, "batch_ms", bestMS, "holder_batch_ms", holderMS)
}

// roleRankGone re-resolves the role among the survivors when its holder
// left the cohort.
func (r *runner) roleRankGone(rank uint32, survivors []uint32) {
	if r.role != rank {
		return
	}
	r.moveRole(r.pickRole(survivors), record.RoleLost)
}

// pickRole is eval_rank's choice among live (not empty), holder aside: the
// fixed rank while it lives, else the fastest once every live rank has a
// batch time, else the lowest.
func (r *runner) pickRole(live []uint32) uint32 {
	if n, ok := r.cfg.Coordinator.FixedEvalRank(); ok && slices.Contains(live, n) {
		return n
	}
	if r.cfg.Coordinator.EvalRank == config.EvalRankFastest {
		if best, ok := r.fastest(live); ok {
			return best
		}
	}
	return live[0]
}

// fastest returns the live rank with the lowest smoothed batch time (the
// lower rank on a tie); false until every live rank has reported one.
func (r *runner) fastest(live []uint32) (uint32, bool) {
	if len(live) == 0 {
		return 0, false
	}
	best := live[0]
	for _, id := range live {
		ms := r.disp.BatchMS(id)
		if !(ms > 0) {
			return 0, false
		}
		if ms < r.disp.BatchMS(best) {
			best = id
		}
	}
	return best, true
}

// moveRole hands the role to rank to, tells every live rank and records
// why.
func (r *runner) moveRole(to uint32, why string, detail ...any) {
	from := r.role
	r.role = to
	r.noteRole(r.epoch+1, why)
	r.log.Info("eval role moved", append([]any{"from", from, "to", to, "why", why, "epoch", r.epoch}, detail...)...)
	r.broadcast(&wirepb.SetEpochCallbackRole{Rank: to})
}

// noteRole records the role's holder for the summary.
func (r *runner) noteRole(epoch uint64, why string) {
	r.rep.Role(record.RoleElection{Epoch: epoch, Rank: r.role, Why: why})
}

// evaluates reports whether epoch e (from 0) is evaluated: every
// eval_every-th epoch, and the run's last whenever any is, so a finished
// run reports its final accuracy.
func (r *runner) evaluates(e uint64) bool {
	n := uint64(max(r.cfg.Coordinator.EvalEvery, 0))
	return n > 0 && ((e+1)%n == 0 || e+1 >= uint64(r.cfg.Run.Epochs))
}
