package reduceserver

// The round barrier: gathering every live rank's announce, planning the
// round, telling each host's leader when its host folded (it then sums
// with the other leaders over their ring, plugins/averaging-cpu/internal/ring),
// and collecting each participant's done before the next one.

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/cohortdl/cohort/shared/reduce"
)

type round struct {
	id        uint64
	broadcast bool
	root      uint32
	w, m      float64
	hosts     []*hostRound
	hostOf    map[uint32]*hostRound
	finished  int
	// bytes is what the leaders' ring moves: each of H links carries
	// 2·(H−1)/H of a fold.
	bytes uint64
}

type hostRound struct {
	ranks    []uint32
	leader   uint32
	folded   map[uint32]bool
	sendSent bool
	applied  bool
	done     map[uint32]reduce.Done
	finished bool
}

func (e *engine) announce(m *member, a reduce.Announce) error {
	r := m.rc.rank
	if e.cur != nil {
		return fmt.Errorf("announced round %d while round %d is in flight", a.Round, e.cur.id)
	}
	if _, dup := e.announces[r]; dup {
		return fmt.Errorf("announced round %d twice", a.Round)
	}
	if e.anyFailed && a.Round <= e.failedUpTo {
		e.send(m, reduce.KindFail, reduce.Fail{Round: a.Round, Reason: fmt.Sprintf("round %d was abandoned: %s", a.Round, e.failReason)}.Encode())
		return nil
	}
	if e.anyDone && a.Round <= e.doneUpTo {
		e.send(m, reduce.KindFail, reduce.Fail{Round: a.Round, Reason: fmt.Sprintf("round %d is out of step: round %d already finished", a.Round, e.doneUpTo)}.Encode())
		return nil
	}
	if a.Broadcast && a.Root >= e.s.cfg.World {
		e.send(m, reduce.KindFail, reduce.Fail{Round: a.Round, Reason: fmt.Sprintf("broadcast root %d out of range for world %d", a.Root, e.s.cfg.World)}.Encode())
		return nil
	}
	e.announces[r] = a
	e.tryPlan()
	return nil
}

// failGathering fails a round that never started: every announcer gets
// the reason.
func (e *engine) failGathering(id uint64, reason string) {
	e.log.Error("averaging round refused", "round", id, "reason", reason)
	for r, a := range e.announces {
		if m := e.members[r]; m != nil {
			e.send(m, reduce.KindFail, reduce.Fail{Round: a.Round, Reason: reason}.Encode())
		}
		e.failedUpTo = max(e.failedUpTo, a.Round)
	}
	e.anyFailed = true
	e.failReason = reason
	e.s.failed.Add(1)
	clear(e.announces)
}

func (e *engine) tryPlan() {
	if !e.formed || e.cur != nil || len(e.announces) == 0 {
		return
	}
	var first *reduce.Announce
	var firstRank uint32
	ranks := make([]uint32, 0, len(e.members))
	for r := range e.members {
		a, ok := e.announces[r]
		if !ok {
			return
		}
		ranks = append(ranks, r)
		if first == nil || r < firstRank {
			a := a
			first, firstRank = &a, r
		}
	}
	if len(ranks) == 0 {
		return
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i] < ranks[j] })
	var w, mv float64
	seed := false
	for _, r := range ranks {
		a := e.announces[r]
		switch {
		case a.Round != first.Round:
			e.failGathering(max(a.Round, first.Round), fmt.Sprintf("ranks disagree on the round: rank %d announced %d, rank %d announced %d", firstRank, first.Round, r, a.Round))
			return
		case a.Broadcast != first.Broadcast || (a.Broadcast && a.Root != first.Root):
			e.failGathering(a.Round, fmt.Sprintf("ranks disagree on round %d's mode: rank %d (broadcast=%v root %d), rank %d (broadcast=%v root %d)",
				a.Round, firstRank, first.Broadcast, first.Root, r, a.Broadcast, a.Root))
			return
		case a.OuterSteps != first.OuterSteps || a.OuterID != first.OuterID:
			if !seed {
				e.log.Warn("ranks disagree on the outer optimizer state; every rank restarts it from this round's consensus",
					"round", a.Round, "rank", firstRank, "steps", first.OuterSteps, "state", fmt.Sprintf("%x", first.OuterID),
					"other_rank", r, "other_steps", a.OuterSteps, "other_state", fmt.Sprintf("%x", a.OuterID))
			}
			seed = true
		}
		w += a.Weight
		if a.Steps > 0 {
			mv++
		}
	}
	id := first.Round
	if first.Broadcast && e.members[first.Root] == nil {
		e.failGathering(id, fmt.Sprintf("broadcast root %d is not a live rank", first.Root))
		return
	}
	realized := first.Broadcast || w > 0
	if math.IsInf(w, 0) {
		e.failGathering(id, "total weight overflows")
		return
	}
	rd := &round{id: id, broadcast: first.Broadcast, root: first.Root, w: w, m: mv, hostOf: map[uint32]*hostRound{}}
	if h := uint64(len(e.hosts)); h > 1 {
		geo := e.s.geometryNow()
		wire := geo.Wire
		if rd.broadcast {
			wire = reduce.WireF32
		}
		rd.bytes = 2 * (h - 1) * geo.Elements() * wire.Size()
	}
	for _, h := range e.hosts {
		hr := &hostRound{ranks: h, leader: h[0], folded: map[uint32]bool{}, done: map[uint32]reduce.Done{}}
		for _, r := range h {
			rd.hostOf[r] = hr
		}
		rd.hosts = append(rd.hosts, hr)
	}
	for _, hr := range rd.hosts {
		p := reduce.Plan{Round: id, Topology: e.topoGen, Realized: realized, Broadcast: rd.broadcast, Seed: seed, Root: rd.root,
			Hosts: uint32(len(rd.hosts)), TotalWeight: w, TotalMovers: mv}
		for _, r := range hr.ranks {
			p.Parts = append(p.Parts, reduce.PlanPart{Rank: r, Weight: e.announces[r].Weight})
		}
		b := p.Encode()
		for _, r := range hr.ranks {
			e.send(e.members[r], reduce.KindPlan, b)
		}
	}
	clear(e.announces)
	if !realized {
		e.log.Debug("round idle: nobody trained", "round", id)
		e.complete(id)
		return
	}
	e.cur = rd
	e.log.Debug("round planned", "round", id, "hosts", len(rd.hosts), "weight", w, "movers", mv, "broadcast", rd.broadcast)
}

func (e *engine) complete(id uint64) {
	e.anyDone = true
	e.doneUpTo = id
	e.s.rounds.Add(1)
}

// failRound ends the round in flight with reason; every live participant
// gets a Fail.
func (e *engine) failRound(reason string) {
	rd := e.cur
	e.cur = nil
	e.log.Error("averaging round failed", "round", rd.id, "reason", reason)
	for _, hr := range rd.hosts {
		b := reduce.Fail{Round: rd.id, Reason: reason}.Encode()
		for _, r := range hr.ranks {
			if m := e.members[r]; m != nil {
				e.send(m, reduce.KindFail, b)
			}
		}
	}
	e.anyFailed = true
	e.failedUpTo = max(e.failedUpTo, rd.id)
	e.failReason = reason
	e.s.failed.Add(1)
}

func (e *engine) abort(r uint32, a reduce.Abort) {
	reason := fmt.Sprintf("rank %d aborted round %d: %s", r, a.Round, strings.TrimSpace(a.Reason))
	if e.cur != nil && e.cur.id == a.Round {
		e.failRound(reason)
		return
	}
	if len(e.announces) > 0 {
		for _, an := range e.announces {
			if an.Round == a.Round {
				e.failGathering(a.Round, reason)
				return
			}
		}
	}
	if !e.anyFailed || a.Round > e.failedUpTo {
		e.anyFailed = true
		e.failedUpTo = a.Round
		e.failReason = reason
	}
}

// roundFor returns the round in flight and m's host's share of it if id
// names that round; a frame for a round that already ended returns nils
// (it is ignored); any other id is an error.
func (e *engine) roundFor(m *member, id uint64, what string) (*round, *hostRound, error) {
	if e.cur != nil && e.cur.id == id {
		hr := e.cur.hostOf[m.rc.rank]
		if hr == nil {
			return nil, nil, fmt.Errorf("%s for round %d, in which it takes no part", what, id)
		}
		return e.cur, hr, nil
	}
	if (e.anyFailed && id <= e.failedUpTo) || (e.anyDone && id <= e.doneUpTo) {
		return nil, nil, nil // a late frame of a round that ended
	}
	return nil, nil, fmt.Errorf("%s for round %d, which is not in flight", what, id)
}

func (e *engine) folded(m *member, id uint64) error {
	rd, hr, err := e.roundFor(m, id, "folded")
	if rd == nil {
		return err
	}
	if len(rd.hosts) == 1 {
		return errors.New("folded in a single-host round")
	}
	r := m.rc.rank
	if hr.folded[r] {
		return fmt.Errorf("folded round %d twice", id)
	}
	hr.folded[r] = true
	if len(hr.folded) == len(hr.ranks) {
		hr.sendSent = true
		e.send(e.members[hr.leader], reduce.KindSend, reduce.RoundRef{Round: id}.Encode())
	}
	return nil
}

func (e *engine) received(m *member, id uint64) error {
	rd, hr, err := e.roundFor(m, id, "received")
	if rd == nil {
		return err
	}
	if m.rc.rank != hr.leader || !hr.sendSent || hr.applied {
		return fmt.Errorf("received for round %d out of turn", id)
	}
	hr.applied = true
	b := reduce.RoundRef{Round: id}.Encode()
	for _, r := range hr.ranks {
		e.send(e.members[r], reduce.KindApply, b)
	}
	return nil
}

func (e *engine) done(m *member, d reduce.Done) error {
	rd, hr, err := e.roundFor(m, d.Round, "done")
	if rd == nil {
		return err
	}
	r := m.rc.rank
	if len(rd.hosts) > 1 && !hr.applied {
		return fmt.Errorf("done for round %d before its host had the consensus", d.Round)
	}
	if _, dup := hr.done[r]; dup {
		return fmt.Errorf("done for round %d twice", d.Round)
	}
	if len(d.Parts) != len(hr.ranks) {
		return fmt.Errorf("done for round %d has %d partial sums, its host has %d ranks", d.Round, len(d.Parts), len(hr.ranks))
	}
	for i, p := range d.Parts {
		if p.Rank != hr.ranks[i] {
			return fmt.Errorf("done for round %d: partial sum %d is for rank %d, want %d", d.Round, i, p.Rank, hr.ranks[i])
		}
	}
	hr.done[r] = d
	if len(hr.done) < len(hr.ranks) {
		return nil
	}
	hr.finished = true
	var post2 float64
	diff := make([]float64, len(hr.ranks))
	pre := make([]float64, len(hr.ranks))
	for _, q := range hr.ranks {
		dd := hr.done[q]
		post2 += dd.Post2
		for i, p := range dd.Parts {
			diff[i] += p.Diff2
			pre[i] += p.Pre2
		}
	}
	for i, q := range hr.ranks {
		e.send(e.members[q], reduce.KindResult, reduce.Result{Round: d.Round, Diff2: diff[i], Pre2: pre[i], Post2: post2, Bytes: rd.bytes}.Encode())
	}
	rd.finished++
	if rd.finished == len(rd.hosts) {
		e.cur = nil
		e.s.bulk.Add(rd.bytes)
		e.complete(rd.id)
		e.log.Debug("round done", "round", rd.id)
	}
	return nil
}
