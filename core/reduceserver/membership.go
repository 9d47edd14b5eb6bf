package reduceserver

// Membership: who is connected, who shares a host, who is gone. Every change
// is told to the live ranks before a round may start on it.

import (
	"errors"
	"fmt"
	"sort"

	"github.com/cohortdl/cohort/shared/reduce"
)

// remove takes rank out of the membership. lost says its connection
// failed (the coordinator may hear of it); absent keeps its slot open: a
// formed cohort's rank whose link merely broke is absent, not dead, since
// the coordinator owns deaths (it says so with MarkDead) and a rank whose
// averager was replaced dials again and takes its slot back. Every other
// removal is for good.
func (e *engine) remove(r uint32, why string, err error, lost, absent bool) {
	if e.gone[r] {
		return
	}
	m := e.members[r]
	if absent && m == nil {
		return
	}
	e.s.mu.Lock()
	if absent {
		delete(e.s.present, r)
	} else {
		e.gone[r] = true
		e.s.dead[r] = true
	}
	e.s.mu.Unlock()
	delete(e.members, r)
	if m != nil {
		m.rc.conn.Close()
		e.s.connected.Add(-1)
	}
	switch {
	case err != nil && e.s.ctx.Err() != nil:
		// The server is closing: a connection cut mid-goodbye is expected.
		e.log.Debug("rank's connection closed with the server", "rank", r, "error", err.Error())
	case err != nil && !errors.Is(err, errBye):
		if e.ending && lost && why == whyLost {
			e.log.Info("rank left as the cohort ends, its goodbye lost", "rank", r, "error", err.Error())
		} else {
			e.log.Error("rank leaves the cohort", "rank", r, "why", why, "error", err.Error())
		}
		if lost && e.s.cfg.OnRankLost != nil {
			e.s.cfg.OnRankLost(r, err)
		}
	case errors.Is(err, errBye):
		e.ending = true
		e.log.Info("rank said goodbye", "rank", r)
	default:
		e.log.Warn("rank leaves the cohort", "rank", r, "why", why)
	}
	if e.cur != nil && e.cur.hostOf[r] != nil {
		reason := fmt.Sprintf("rank %d %s during round %d", r, why, e.cur.id)
		if err != nil && !errors.Is(err, errBye) {
			reason += ": " + err.Error()
		}
		e.failRound(reason)
	}
	delete(e.announces, r)
	e.membershipChanged()
}

// membershipChanged recomputes formation and topology and tells every live
// rank, then sees whether a round can start.
func (e *engine) membershipChanged() {
	if !e.formed {
		for r := uint32(0); r < e.s.cfg.World; r++ {
			if m := e.members[r]; !e.gone[r] && (m == nil || m.join == nil) {
				return
			}
		}
		e.formed = true
		e.log.Info("cohort formed on the data channel", "live", len(e.members), "world", e.s.cfg.World)
	}
	e.topoGen++
	// Group live ranks by host, hosts ordered by their lowest rank.
	ranks := make([]uint32, 0, len(e.members))
	for r, m := range e.members {
		if m.join != nil {
			ranks = append(ranks, r)
		}
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i] < ranks[j] })
	idx := map[[16]byte]int{}
	e.hosts = e.hosts[:0]
	for _, r := range ranks {
		k := e.members[r].rc.hello.Host
		i, ok := idx[k]
		if !ok {
			i = len(e.hosts)
			idx[k] = i
			e.hosts = append(e.hosts, nil)
		}
		e.hosts[i] = append(e.hosts[i], r)
	}
	leaders := make([]string, len(e.hosts))
	for hi, h := range e.hosts {
		leaders[hi] = e.members[h[0]].ring
	}
	for hi, h := range e.hosts {
		t := reduce.Topology{Generation: e.topoGen, Hosts: uint32(len(e.hosts)), Host: uint32(hi), Leaders: leaders}
		for _, r := range h {
			j := e.members[r].join
			t.Peers = append(t.Peers, reduce.Peer{Rank: r, Dev: j.Dev, Ino: j.Ino, Path: j.ArenaPath})
		}
		b := t.Encode()
		for _, r := range h {
			e.send(e.members[r], reduce.KindTopology, b)
		}
	}
	e.log.Debug("topology", "generation", e.topoGen, "hosts", len(e.hosts), "ranks", len(ranks))
	e.tryPlan()
}

func (e *engine) session(from uint32, s reduce.Session) {
	if s.Generation <= e.sessionGen {
		return
	}
	e.sessionGen = s.Generation
	in := map[uint32]bool{}
	for _, m := range s.Members {
		in[m] = true
	}
	for r := uint32(0); r < e.s.cfg.World; r++ {
		if !in[r] && !e.gone[r] {
			e.remove(r, fmt.Sprintf("is not in session %d (announced by rank %d)", s.Generation, from), nil, false, false)
		}
	}
}

func (s *Server) geometryNow() reduce.Hello {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.geometry
}
