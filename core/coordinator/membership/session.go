package membership

import (
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Sessions re-forms the averaging group after a death: the lowest
// survivor makes a session id, and once it has and no round is in flight
// every survivor is sent NewSession.
type Sessions struct {
	roster     *Roster
	log        hclog.Logger
	timeout    time.Duration // how long a survivor gets to answer RequestSessionId
	generation uint64
	session    *sessionReq
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

// NewSessions re-forms the group among roster's ranks; a survivor gets
// timeout to answer before the next one is asked.
func NewSessions(roster *Roster, timeout time.Duration, log hclog.Logger) *Sessions {
	return &Sessions{roster: roster, timeout: timeout, log: log}
}

// Pending reports whether a re-formation is under way: no round may be
// issued before it completes, or the round would meet the old group.
func (s *Sessions) Pending() bool { return s.session != nil }

// Request starts (or restarts, for a later death) the re-formation of the
// averaging group: the lowest survivor makes the session id.
func (s *Sessions) Request(survivors []uint32) {
	s.generation++
	s.session = &sessionReq{gen: s.generation, tried: map[uint32]bool{}}
	s.ask(survivors[0])
}

func (s *Sessions) ask(generator uint32) {
	q := s.session
	q.generator = generator
	q.tried[generator] = true
	q.deadline = time.Now().Add(s.timeout)
	s.roster.Send(generator, &wirepb.RequestSessionId{Generation: q.gen})
	s.log.Debug("session id requested", "generation", q.gen, "rank", generator)
}

// Deadline is when the survivor asked for a session id runs out of time;
// false when nothing waits on the clock.
func (s *Sessions) Deadline() (time.Time, bool) {
	if q := s.session; q != nil && !q.haveID {
		return q.deadline, true
	}
	return time.Time{}, false
}

// Check asks the next survivor when the one asked did not answer by now;
// with none left the run cannot average again, and the error says so.
func (s *Sessions) Check(now time.Time) error {
	q := s.session
	if q == nil || q.haveID || now.Before(q.deadline) {
		return nil
	}
	live := s.roster.Live()
	i := slices.IndexFunc(live, func(id uint32) bool { return !q.tried[id] })
	if i < 0 {
		s.session = nil
		s.log.Error("no survivor produced a session id; saving and stopping", "generation", q.gen)
		return fmt.Errorf("coordinator: no survivor answered RequestSessionId (generation %d)", q.gen)
	}
	s.log.Warn("session id request timed out; asking the next survivor", "generation", q.gen, "rank", live[i])
	s.ask(live[i])
	return nil
}

// OnID takes a survivor's SessionIdGenerated.
func (s *Sessions) OnID(rank uint32, m *wirepb.SessionIdGenerated) {
	q := s.session
	if q == nil || m.GetGeneration() != q.gen || rank != q.generator || q.haveID {
		s.log.Debug("ignoring a stale session id", "rank", rank, "generation", m.GetGeneration())
		return
	}
	q.haveID = true
	q.id = slices.Clone(m.GetSessionId())
}

// Step sends NewSession once the id is known and no round is in flight
// (inRound); it reports whether it did. Holding it back while a round
// runs matters: a survivor that has not yet entered the old round must
// find its averager aborted (so it acks aborted like the others), not
// join the old round number on the new group and wait there forever for
// peers that already moved on.
func (s *Sessions) Step(inRound bool) bool {
	q := s.session
	if q == nil || !q.haveID || inRound {
		return false
	}
	s.session = nil
	members := s.roster.Live()
	for i, id := range members {
		s.roster.Send(id, &wirepb.NewSession{
			Generation:   q.gen,
			SessionId:    q.id,
			NewRank:      uint32(i),
			NewWorldSize: uint32(len(members)),
			Members:      members,
		})
	}
	s.log.Info("averaging group re-formed", "generation", q.gen, "members", members)
	return true
}
