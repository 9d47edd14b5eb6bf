package membership

import (
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Speeds is what the role knows of the ranks' speeds: each one's smoothed
// batch time in milliseconds, 0 before its first report
// (*dispatch.Dispatcher is one).
type Speeds interface {
	BatchMS(rank uint32) float64
}

// Role is the eval role: the rank that evaluates each epoch, runs the
// epoch callback and saves the trained model, chosen by
// coordinator.eval_rank; and the evaluation it owes.
type Role struct {
	cfg    config.Coordinator
	roster *Roster
	speeds Speeds
	// note records each move of the role (for the summary).
	note func(record.RoleElection)
	log  hclog.Logger
	role uint32 // the holder
	// target is the rank whose EvalResult is awaited; -1: none.
	target int64
}

// NewRole is the role among roster's ranks; note is told of each move.
func NewRole(cfg config.Coordinator, roster *Roster, speeds Speeds, note func(record.RoleElection), log hclog.Logger) *Role {
	return &Role{cfg: cfg, roster: roster, speeds: speeds, note: note, log: log, target: -1}
}

// Holder is the role's rank.
func (r *Role) Holder() uint32 { return r.role }

// roleHysteresis: under eval_rank = fastest the role moves only to a rank
// whose batch time is at most this share of the holder's (10% faster), so
// ranks of about the same speed do not trade it back and forth on jitter.
const roleHysteresis = 0.9

// Form gives the role to eval_rank's pick when the cohort forms: the
// fixed rank, else the lowest (nobody has a batch time yet). epoch (from
// 1) is the epoch the run starts with.
func (r *Role) Form(epoch uint64) {
	r.role = r.pick(r.roster.Live())
	r.noteRole(epoch, record.RoleFormed)
	r.log.Info("eval role assigned", "rank", r.role, "eval_rank", r.cfg.EvalRank)
	r.roster.Broadcast(&wirepb.SetEpochCallbackRole{Rank: r.role})
}

// Elect runs at the end of epoch (from 0), before its evaluation: under
// eval_rank = fastest, once every live rank has a batch time, the fastest
// takes the role if it beats the holder by the hysteresis margin. The other
// policies' holder only changes when it leaves (RankGone).
func (r *Role) Elect(epoch uint64) {
	if r.cfg.EvalRank != config.EvalRankFastest {
		return
	}
	best, ok := r.fastest(r.roster.Live())
	holderMS, bestMS := r.speeds.BatchMS(r.role), r.speeds.BatchMS(best)
	if !ok || best == r.role || bestMS > roleHysteresis*holderMS {
		return
	}
	r.move(epoch, best, record.RoleFaster, "batch_ms", bestMS, "holder_batch_ms", holderMS)
}

// RankGone re-resolves the role among the survivors when its holder
// left the cohort in epoch (from 0).
func (r *Role) RankGone(epoch uint64, rank uint32, survivors []uint32) {
	if r.role != rank {
		return
	}
	r.move(epoch, r.pick(survivors), record.RoleLost)
}

// pick is eval_rank's choice among live (not empty), holder aside: the
// fixed rank while it lives, else the fastest once every live rank has a
// batch time, else the lowest.
func (r *Role) pick(live []uint32) uint32 {
	if n, ok := r.cfg.FixedEvalRank(); ok && slices.Contains(live, n) {
		return n
	}
	if r.cfg.EvalRank == config.EvalRankFastest {
		if best, ok := r.fastest(live); ok {
			return best
		}
	}
	return live[0]
}

// fastest returns the live rank with the lowest smoothed batch time (the
// lower rank on a tie); false until every live rank has reported one.
func (r *Role) fastest(live []uint32) (uint32, bool) {
	if len(live) == 0 {
		return 0, false
	}
	best := live[0]
	for _, id := range live {
		ms := r.speeds.BatchMS(id)
		if !(ms > 0) {
			return 0, false
		}
		if ms < r.speeds.BatchMS(best) {
			best = id
		}
	}
	return best, true
}

// move hands the role to rank to in epoch (from 0), tells every live rank
// and records why.
func (r *Role) move(epoch uint64, to uint32, why string, detail ...any) {
	from := r.role
	r.role = to
	r.noteRole(epoch+1, why)
	r.log.Info("eval role moved", append([]any{"from", from, "to", to, "why", why, "epoch", epoch + 1}, detail...)...)
	r.roster.Broadcast(&wirepb.SetEpochCallbackRole{Rank: to})
}

// noteRole records the role's holder for the summary.
func (r *Role) noteRole(epoch uint64, why string) {
	r.note(record.RoleElection{Epoch: epoch, Rank: r.role, Why: why})
}

// Evaluate asks the role's rank to evaluate epoch (again, when the
// previous target was lost and the role moved).
func (r *Role) Evaluate(epoch uint64) {
	if len(r.roster.Live()) == 0 {
		return
	}
	r.target = int64(r.role)
	r.roster.Send(r.role, &wirepb.Evaluate{ScheduleId: epoch, Epoch: epoch, TargetRank: r.role})
}

// Evaluating reports whether the evaluation awaited is rank's.
func (r *Role) Evaluating(rank uint32) bool { return r.target == int64(rank) }

// Evaluated takes rank's EvalResult for schedule: false when it is not
// the one awaited for epoch.
func (r *Role) Evaluated(rank uint32, schedule, epoch uint64) bool {
	if r.target != int64(rank) || schedule != epoch {
		return false
	}
	r.target = -1
	return true
}
