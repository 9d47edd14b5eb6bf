package coordinator

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// heartbeat is the coordinator's proof of life to every connected rank: a
// rank that hears nothing past its liveness timeout shuts down. A rank's
// own silence is caught by its connection's read timeout (the heartbeat
// timeout, set in run), which ends in onLinkDown.
func (r *runner) heartbeat() {
	r.hbSeq++
	msg := &wirepb.CoordinatorHeartbeat{Sequence: r.hbSeq}
	for _, rs := range r.ranks {
		if rs.status == stJoined || rs.status == stReady || rs.status == stLive {
			r.send(rs, msg)
		}
	}
}

// onLinkDown handles a broken or silent link: before formation the rank
// may connect again; a member of the cohort is dead.
func (r *runner) onLinkDown(rs *rankState, err error) {
	switch rs.status {
	case stExited, stDead:
		rs.link.Close()
		return
	case stJoined, stReady:
		// Before formation a lost rank may simply connect again.
		r.log.Warn("rank left before the cohort formed", "rank", rs.id, "error", err)
		r.dropUnformed(rs)
		return
	}
	r.noteDeath(rs.id, linkReason(err, r.hbTimeout))
}

// linkReason says why a link counts as dead.
func linkReason(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("silent for %v (heartbeat timeout)", timeout)
	case errors.Is(err, io.EOF):
		return "link closed without Exiting"
	}
	return fmt.Sprintf("link broken: %v", err)
}

// deathNote is a death found while handling an event, applied after it.
type deathNote struct {
	rank   uint32
	reason string
}

// noteDeath queues a death; advance applies it after the current handler,
// so a failure found in the middle of a broadcast never changes the set
// of ranks being iterated.
func (r *runner) noteDeath(rank uint32, reason string) {
	for _, d := range r.deathQ {
		if d.rank == rank {
			return
		}
	}
	r.deathQ = append(r.deathQ, deathNote{rank, reason})
}

// onExiting records a clean exit. One in the middle of training is a
// departure, handled like a death but not counted as one.
func (r *runner) onExiting(rs *rankState) {
	switch rs.status {
	case stJoined, stReady:
		r.dropUnformed(rs)
		return
	case stLive:
	default:
		return
	}
	if r.phase == phShutdown || r.phase == phSaving {
		r.setStatus(rs, stExited)
		r.log.Debug("rank exited", "rank", rs.id)
		return
	}
	r.depart(rs, record.EventLeft, "sent Exiting before the run ended", stExited)
}

// lose handles a rank found dead (its link broke, or it fell silent, or it
// stopped reading).
func (r *runner) lose(rs *rankState, reason string) {
	switch rs.status {
	case stJoined, stReady:
		r.log.Warn("rank lost before the cohort formed", "rank", rs.id, "reason", reason)
		r.dropUnformed(rs)
		return
	case stLive:
		r.depart(rs, record.EventDead, reason, stDead)
	}
}

// depart removes a live rank from the cohort: record the event, tell the
// survivors (DeclareDead: their watchdog aborts a round waiting on it),
// re-elect the epoch-callback rank, give its unfinished samples to the
// survivors, and re-form the averaging group; below min_ranks survivors,
// save and stop instead.
func (r *runner) depart(rs *rankState, event, reason string, status rankStatus) {
	r.setStatus(rs, status)
	r.rep.Left(rs.id, reason)
	if rs.link != nil {
		rs.link.Close()
	}
	ev := record.MembershipEvent{Rank: rs.id, Event: event, Epoch: r.epoch + 1, Reason: reason, Time: time.Now()}
	r.log.Warn("rank removed from the cohort", "rank", rs.id, "event", event, "reason", reason,
		"epoch", r.epoch, "phase", r.phase.String())
	r.emit(Progress{Kind: ProgressMembership, Event: &ev})
	r.rep.Member(ev)
	r.meet.Dead(rs.id, reason)
	unfinished := r.unfinishedOf(rs)
	survivors := r.live()
	var death *record.DeathRecord
	if status == stDead {
		death = r.rep.NewDeath(ev, r.phase.String(), unfinished)
		// Kept when depart returns, whichever way it ends.
		defer r.rep.KeepDeath(death)
	}

	switch r.phase {
	case phShutdown:
		return
	case phSaving:
		if r.save != nil {
			r.save.Gone(rs.id)
			r.settleCkpt(r.save)
		}
		return
	case phExport:
		if r.export.RankGone(rs.id) {
			r.shutdown()
		}
		return
	}

	if len(survivors) == 0 {
		r.finish(record.StatusFailed, fmt.Errorf("coordinator: every rank is lost (last: rank %d, %s)", rs.id, reason))
		return
	}
	dd := &wirepb.DeclareDead{Rank: rs.id, Reason: reason}
	for _, id := range survivors {
		r.send(r.ranks[id], dd)
	}
	r.roleRankGone(rs.id, survivors)
	if rd := r.round; rd != nil {
		delete(rd.waiting, rs.id)
		delete(rd.acks, rs.id)
	}

	if min := r.cfg.Coordinator.MinRanks; len(survivors) < min {
		r.log.Error("too few ranks left to carry on; saving and stopping", "live", len(survivors), "min_ranks", min)
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_TOO_FEW_RANKS, checkpoint.ReasonTooFewRanks, record.StatusFailed,
			fmt.Errorf("coordinator: %d live ranks after rank %d was lost (%s), min_ranks is %d", len(survivors), rs.id, reason, min))
		return
	}
	handed := r.redistribute(unfinished, survivors)
	if death != nil {
		death.Redistributed = handed
	}
	r.requestSession(survivors)
	// Whatever waited on the lost rank can move on now; last, since each
	// may advance the run (to the next epoch, or the next window).
	if r.evalTarget == int64(rs.id) {
		r.sendEvaluate()
	}
	if r.ckpt != nil {
		r.ckpt.Gone(rs.id)
		r.settleCkpt(r.ckpt)
	}
	r.checkRound()
}

// unfinishedOf takes a departing rank's work back: the part of each open
// plan no Batch report covers, then its undispatched partition. The part
// reports cover counts as trained.
func (r *runner) unfinishedOf(rs *rankState) []dispatch.Range {
	out, trained := r.disp.Forfeit(rs.id)
	for _, t := range trained {
		r.rep.Unclosed(t)
	}
	return out
}

// redistribute hands the ranges to the survivors in equal consecutive
// shares, each piece one ExtendPartition (and one plan) of its own, and
// returns the pieces.
func (r *runner) redistribute(rs []dispatch.Range, survivors []uint32) []dispatch.Handoff {
	handed := r.disp.Extend(rs, survivors)
	for _, h := range handed {
		r.send(r.ranks[h.Rank], &wirepb.ExtendPartition{Epoch: r.epoch, PartitionOffset: h.Offset, PartitionSize: h.Size})
	}
	return handed
}

// sessionReq is a re-formation of the averaging group after a death:
// waiting for the generator's session id, then for the in-flight round to
// resolve, then NewSession goes out.
type sessionReq struct {
	gen       uint64
	generator uint32
	deadline  time.Time
	tried     map[uint32]bool
	haveID    bool
	id        []byte
}

// requestSession starts (or restarts, for a later death) the re-formation
// of the averaging group: the lowest survivor makes the session id.
func (r *runner) requestSession(survivors []uint32) {
	r.generation++
	r.session = &sessionReq{gen: r.generation, tried: map[uint32]bool{}}
	r.askSession(survivors[0])
}

func (r *runner) askSession(generator uint32) {
	s := r.session
	s.generator = generator
	s.tried[generator] = true
	s.deadline = time.Now().Add(r.sessionTimeout())
	r.send(r.ranks[generator], &wirepb.RequestSessionId{Generation: s.gen})
	r.log.Debug("session id requested", "generation", s.gen, "rank", generator)
}

func (r *runner) sessionTimeout() time.Duration {
	if d := r.c.opts.SessionTimeout; d > 0 {
		return d
	}
	return max(5*time.Second, r.hbTimeout)
}

// retrySession asks the next survivor when the generator did not answer
// in time; with none left the run cannot average again.
func (r *runner) retrySession() {
	s := r.session
	live := r.live()
	i := slices.IndexFunc(live, func(id uint32) bool { return !s.tried[id] })
	if i < 0 {
		r.session = nil
		r.log.Error("no survivor produced a session id; saving and stopping", "generation", s.gen)
		r.beginSave(wirepb.ShutdownReason_SHUTDOWN_REASON_REDUCE_STALL, checkpoint.ReasonStall, record.StatusFailed,
			fmt.Errorf("coordinator: no survivor answered RequestSessionId (generation %d)", s.gen))
		return
	}
	r.log.Warn("session id request timed out; asking the next survivor", "generation", s.gen, "rank", live[i])
	r.askSession(live[i])
}

func (r *runner) onSessionID(rs *rankState, m *wirepb.SessionIdGenerated) {
	s := r.session
	if s == nil || m.GetGeneration() != s.gen || rs.id != s.generator || s.haveID {
		r.log.Debug("ignoring a stale session id", "rank", rs.id, "generation", m.GetGeneration())
		return
	}
	s.haveID = true
	s.id = slices.Clone(m.GetSessionId())
}

// stepSession sends NewSession once the id is known and no round is in
// flight. Holding it back while a round runs matters: a survivor that has
// not yet entered the old round must find its averager aborted (so it acks
// aborted like the others), not join the old round number on the new group
// and wait there forever for peers that already moved on.
func (r *runner) stepSession() bool {
	s := r.session
	if s == nil || !s.haveID || r.round != nil {
		return false
	}
	r.session = nil
	members := r.live()
	for i, id := range members {
		r.send(r.ranks[id], &wirepb.NewSession{
			Generation:   s.gen,
			SessionId:    s.id,
			NewRank:      uint32(i),
			NewWorldSize: uint32(len(members)),
			Members:      members,
		})
	}
	r.log.Info("averaging group re-formed", "generation", s.gen, "members", members)
	return true
}
