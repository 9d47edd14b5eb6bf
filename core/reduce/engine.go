package reduce

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	rdc "github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"

	"github.com/cohortdl/cohort/internal/authframe"
)

type evKind int

const (
	evConnected evKind = iota
	evFrame
	evLost
	evDead
)

type event struct {
	kind  evKind
	rc    *rankConn
	frame rdc.Frame
	err   error
	rank  uint32
}

type member struct {
	rc   *rankConn
	join *rdc.Join
}

// engine owns the membership and the rounds; only its goroutine touches
// them.
type engine struct {
	s       *Server
	log     hclog.Logger
	members map[uint32]*member
	gone    map[uint32]bool
	formed  bool
	topoGen uint64
	hosts   [][]uint32

	announces  map[uint32]rdc.Announce
	cur        *round
	failedUpTo uint64
	failReason string
	anyFailed  bool
	doneUpTo   uint64
	anyDone    bool
	sessionGen uint64

	cons   []byte
	consWG sync.WaitGroup
}

type round struct {
	id        uint64
	wire      rdc.Wire // of the folds and the consensus
	broadcast bool
	root      uint32
	w, m      float64
	hosts     []*hostRound
	hostOf    map[uint32]*hostRound
	needed    int // folds needed
	have      int
	consSent  bool
	finished  int
	bytes     uint64
}

type hostRound struct {
	ranks    []uint32
	leader   uint32
	weight   float64
	movers   float64
	needFold bool
	folded   map[uint32]bool
	sendSent bool
	fold     *rankConn // holds the fold in its stage
	applied  bool
	done     map[uint32]rdc.Done
	finished bool
}

func newEngine(s *Server) *engine {
	return &engine{
		s: s, log: s.log, members: map[uint32]*member{}, gone: map[uint32]bool{},
		announces: map[uint32]rdc.Announce{},
	}
}

func (e *engine) run() {
	defer func() {
		for _, m := range e.members {
			m.rc.conn.Close()
		}
		e.consWG.Wait()
	}()
	for {
		select {
		case ev := <-e.s.events:
			e.handle(ev)
		case <-e.s.ctx.Done():
			// Drain connections that were admitted meanwhile.
			for {
				select {
				case ev := <-e.s.events:
					if ev.kind == evConnected {
						ev.rc.conn.Close()
						e.s.connected.Add(-1)
					}
				default:
					return
				}
			}
		}
	}
}

func (e *engine) handle(ev event) {
	switch ev.kind {
	case evConnected:
		r := ev.rc.rank
		if e.gone[r] {
			ev.rc.conn.Close()
			e.s.connected.Add(-1)
			return
		}
		e.members[r] = &member{rc: ev.rc}
	case evDead:
		e.remove(ev.rank, "was declared dead", nil, false)
	case evLost:
		if m := e.members[ev.who()]; m != nil && m.rc == ev.rc {
			why := "lost its data channel"
			for _, bad := range []error{authframe.ErrBadTag, authframe.ErrTruncated, authframe.ErrTooLarge, authframe.ErrBadMagic, authframe.ErrUnknownKind, authframe.ErrMalformed} {
				if errors.Is(ev.err, bad) {
					why = "sent a frame that was refused"
				}
			}
			e.remove(ev.rc.rank, why, ev.err, true)
		}
	case evFrame:
		m := e.members[ev.rc.rank]
		if m == nil || m.rc != ev.rc {
			ev.rc.busy.Store(false)
			return
		}
		if err := e.frame(m, ev.frame); err != nil {
			ev.rc.busy.Store(false)
			e.remove(ev.rc.rank, "broke the protocol", err, true)
		}
	}
}

func (ev event) who() uint32 {
	if ev.rc != nil {
		return ev.rc.rank
	}
	return ev.rank
}

// remove takes rank out of the membership for good.
func (e *engine) remove(r uint32, why string, err error, lost bool) {
	if e.gone[r] {
		return
	}
	e.gone[r] = true
	e.s.mu.Lock()
	e.s.dead[r] = true
	e.s.mu.Unlock()
	m := e.members[r]
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
		e.log.Error("rank leaves the cohort", "rank", r, "why", why, "error", err.Error())
		if lost && e.s.cfg.OnRankLost != nil {
			e.s.cfg.OnRankLost(r, err)
		}
	case errors.Is(err, errBye):
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

var errBye = errors.New("goodbye")

func (e *engine) send(m *member, kind rdc.Kind, payload ...[]byte) {
	if m == nil {
		return
	}
	if _, err := m.rc.conn.SendAsync(kind, payload...); err != nil {
		e.log.Debug("send failed", "rank", m.rc.rank, "kind", kind.String(), "error", err.Error())
	}
}

func (e *engine) frame(m *member, f rdc.Frame) error {
	if m.join == nil && f.Kind != rdc.KindJoin {
		return fmt.Errorf("%v frame before join", f.Kind)
	}
	switch f.Kind {
	case rdc.KindJoin:
		if m.join != nil {
			return errors.New("second join")
		}
		j, err := rdc.DecodeJoin(f.Payload)
		if err != nil {
			return err
		}
		m.join = &j
		e.log.Debug("rank joined", "rank", m.rc.rank, "arena", j.ArenaPath, "pid", j.PID)
		e.membershipChanged()
		return nil
	case rdc.KindAnnounce:
		a, err := rdc.DecodeAnnounce(f.Payload)
		if err != nil {
			return err
		}
		return e.announce(m, a)
	case rdc.KindAbort:
		a, err := rdc.DecodeAbort(f.Payload)
		if err != nil {
			return err
		}
		e.abort(m.rc.rank, a)
		return nil
	case rdc.KindSession:
		s, err := rdc.DecodeSession(f.Payload)
		if err != nil {
			return err
		}
		e.session(m.rc.rank, s)
		return nil
	case rdc.KindBye:
		if err := rdc.DecodeEmpty(f.Kind, f.Payload); err != nil {
			return err
		}
		e.remove(m.rc.rank, "said goodbye", errBye, false)
		return nil
	case rdc.KindFold:
		h, err := rdc.DecodeBulkHeader(f.Payload)
		if err != nil {
			return err
		}
		return e.fold(m, h)
	case rdc.KindFolded, rdc.KindReceived:
		r, err := rdc.DecodeRoundRef(f.Kind, f.Payload)
		if err != nil {
			return err
		}
		if f.Kind == rdc.KindFolded {
			return e.folded(m, r.Round)
		}
		return e.received(m, r.Round)
	case rdc.KindDone:
		d, err := rdc.DecodeDone(f.Payload)
		if err != nil {
			return err
		}
		return e.done(m, d)
	}
	return fmt.Errorf("unexpected %v frame", f.Kind)
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
	for hi, h := range e.hosts {
		t := rdc.Topology{Generation: e.topoGen, Hosts: uint32(len(e.hosts)), Host: uint32(hi)}
		for _, r := range h {
			j := e.members[r].join
			t.Peers = append(t.Peers, rdc.Peer{Rank: r, Dev: j.Dev, Ino: j.Ino, Path: j.ArenaPath})
		}
		b := t.Encode()
		for _, r := range h {
			e.send(e.members[r], rdc.KindTopology, b)
		}
	}
	e.log.Debug("topology", "generation", e.topoGen, "hosts", len(e.hosts), "ranks", len(ranks))
	e.tryPlan()
}

func (e *engine) announce(m *member, a rdc.Announce) error {
	r := m.rc.rank
	if e.cur != nil {
		return fmt.Errorf("announced round %d while round %d is in flight", a.Round, e.cur.id)
	}
	if _, dup := e.announces[r]; dup {
		return fmt.Errorf("announced round %d twice", a.Round)
	}
	if e.anyFailed && a.Round <= e.failedUpTo {
		e.send(m, rdc.KindFail, rdc.Fail{Round: a.Round, Reason: fmt.Sprintf("round %d was abandoned: %s", a.Round, e.failReason)}.Encode())
		return nil
	}
	if e.anyDone && a.Round <= e.doneUpTo {
		e.send(m, rdc.KindFail, rdc.Fail{Round: a.Round, Reason: fmt.Sprintf("round %d is out of step: round %d already finished", a.Round, e.doneUpTo)}.Encode())
		return nil
	}
	if a.Broadcast && a.Root >= e.s.cfg.World {
		e.send(m, rdc.KindFail, rdc.Fail{Round: a.Round, Reason: fmt.Sprintf("broadcast root %d out of range for world %d", a.Root, e.s.cfg.World)}.Encode())
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
			e.send(m, rdc.KindFail, rdc.Fail{Round: a.Round, Reason: reason}.Encode())
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
	var first *rdc.Announce
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
	rd := &round{id: id, broadcast: first.Broadcast, root: first.Root, w: w, m: mv, hostOf: map[uint32]*hostRound{}, wire: rdc.WireF32}
	if !rd.broadcast {
		rd.wire = e.s.geometryNow().Wire
	}
	for _, h := range e.hosts {
		hr := &hostRound{ranks: h, leader: h[0], folded: map[uint32]bool{}, done: map[uint32]rdc.Done{}}
		for _, r := range h {
			a := e.announces[r]
			hr.weight += a.Weight
			if a.Steps > 0 {
				hr.movers++
			}
			rd.hostOf[r] = hr
			if rd.broadcast && r == rd.root {
				hr.needFold = true
			}
		}
		if !rd.broadcast {
			hr.needFold = hr.weight > 0
		}
		if hr.needFold {
			rd.needed++
		}
		rd.hosts = append(rd.hosts, hr)
	}
	for _, hr := range rd.hosts {
		p := rdc.Plan{Round: id, Topology: e.topoGen, Realized: realized, Broadcast: rd.broadcast, Seed: seed, Root: rd.root,
			Hosts: uint32(len(rd.hosts)), TotalWeight: w, TotalMovers: mv}
		for _, r := range hr.ranks {
			p.Parts = append(p.Parts, rdc.PlanPart{Rank: r, Weight: e.announces[r].Weight})
		}
		b := p.Encode()
		for _, r := range hr.ranks {
			e.send(e.members[r], rdc.KindPlan, b)
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
		if hr.fold != nil {
			hr.fold.busy.Store(false)
		}
		b := rdc.Fail{Round: rd.id, Reason: reason}.Encode()
		for _, r := range hr.ranks {
			if m := e.members[r]; m != nil {
				e.send(m, rdc.KindFail, b)
			}
		}
	}
	e.anyFailed = true
	e.failedUpTo = max(e.failedUpTo, rd.id)
	e.failReason = reason
	e.s.failed.Add(1)
}

func (e *engine) abort(r uint32, a rdc.Abort) {
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

func (e *engine) session(from uint32, s rdc.Session) {
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
			e.remove(r, fmt.Sprintf("is not in session %d (announced by rank %d)", s.Generation, from), nil, false)
		}
	}
}

// stale reports whether a round-scoped frame for id belongs to a round
// that already ended (and is to be ignored); otherwise it returns the
// round in flight if id names it, or an error.
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
	if len(hr.folded) == len(hr.ranks) && hr.needFold {
		hr.sendSent = true
		e.send(e.members[hr.leader], rdc.KindSend, rdc.RoundRef{Round: id}.Encode())
	}
	return nil
}

func (e *engine) fold(m *member, h rdc.BulkHeader) error {
	rd, hr, err := e.roundFor(m, h.Round, "fold")
	if rd == nil {
		m.rc.busy.Store(false)
		return err
	}
	switch {
	case m.rc.rank != hr.leader || !hr.sendSent:
		return fmt.Errorf("fold for round %d without being asked", h.Round)
	case hr.fold != nil:
		return fmt.Errorf("second fold for round %d", h.Round)
	case h.Wire != rd.wire || uint64(len(m.rc.stage)) != e.s.geometryNow().Elements()*h.Wire.Size():
		return fmt.Errorf("fold for round %d encoded %v in %d bytes, the round needs %v", h.Round, h.Wire, len(m.rc.stage), rd.wire)
	case !rd.broadcast && (h.Weight != hr.weight || h.Movers != hr.movers):
		return fmt.Errorf("fold for round %d carries weight %v and %v movers, the host's ranks announced %v and %v",
			h.Round, h.Weight, h.Movers, hr.weight, hr.movers)
	}
	hr.fold = m.rc
	rd.have++
	rd.bytes += uint64(len(m.rc.stage))
	if rd.have == rd.needed {
		e.combine(rd)
	}
	return nil
}

// combine sums the host folds, divides once, and sends the consensus to
// every host's leader.
func (e *engine) combine(rd *round) {
	geo := e.s.geometryNow()
	n := geo.Elements() * rd.wire.Size()
	e.consWG.Wait() // the previous round's consensus is out
	if uint64(cap(e.cons)) < n {
		e.cons = make([]byte, n)
	}
	e.cons = e.cons[:n]
	var srcs [][]byte
	for _, hr := range rd.hosts {
		if hr.fold != nil {
			srcs = append(srcs, hr.fold.stage)
		}
	}
	es := int(rd.wire.Size())
	np, nb := int(geo.Params), int(geo.Buffers)
	if rd.broadcast {
		copy(e.cons, srcs[0])
	} else {
		ps := float32(1 / rd.w)
		bs := float32(0)
		if rd.m > 0 {
			bs = float32(1 / rd.m)
		}
		combineRegion(e.cons, srcs, rd.wire, 0, np, ps, e.s.cfg.Threads)
		combineRegion(e.cons[np*es:], sub(srcs, np*es), rd.wire, 0, nb, bs, e.s.cfg.Threads)
	}
	for _, hr := range rd.hosts {
		if hr.fold != nil {
			hr.fold.busy.Store(false)
		}
	}
	hdr := rdc.BulkHeader{Round: rd.id, Weight: rd.w, Movers: rd.m, Wire: rd.wire}.Encode()
	if rd.broadcast {
		hdr = rdc.BulkHeader{Round: rd.id, Weight: 1, Movers: 1, Wire: rd.wire}.Encode()
	}
	for _, hr := range rd.hosts {
		m := e.members[hr.leader]
		if m == nil {
			continue
		}
		done, err := m.rc.conn.SendAsync(rdc.KindConsensus, hdr, e.cons)
		if err != nil {
			continue
		}
		rd.bytes += n
		e.s.bulk.Add(n)
		e.consWG.Add(1)
		go func() {
			defer e.consWG.Done()
			<-done
		}()
	}
	rd.consSent = true
}

func sub(srcs [][]byte, off int) [][]byte {
	out := make([][]byte, len(srcs))
	for i, s := range srcs {
		out[i] = s[off:]
	}
	return out
}

// combineRegion combines elements [lo, hi) of srcs into dst, in parallel.
func combineRegion(dst []byte, srcs [][]byte, w rdc.Wire, lo, hi int, scale float32, threads int) {
	switch w {
	case rdc.WireF32:
		d := numeric.Float32s(dst)
		ss := make([][]float32, len(srcs))
		for i, s := range srcs {
			ss[i] = numeric.Float32s(s)
		}
		numeric.Parallel(hi-lo, threads, func(a, b int) {
			part := make([][]float32, len(ss))
			for i, s := range ss {
				part[i] = s[lo+a : lo+b]
			}
			numeric.Combine(d[lo+a:lo+b], part, scale)
		})
	case rdc.WireBF16:
		d := numeric.Uint16s(dst)
		ss := make([][]uint16, len(srcs))
		for i, s := range srcs {
			ss[i] = numeric.Uint16s(s)
		}
		numeric.Parallel(hi-lo, threads, func(a, b int) {
			part := make([][]uint16, len(ss))
			for i, s := range ss {
				part[i] = s[lo+a : lo+b]
			}
			numeric.CombineBF16(d[lo+a:lo+b], part, scale)
		})
	}
}

func (e *engine) received(m *member, id uint64) error {
	rd, hr, err := e.roundFor(m, id, "received")
	if rd == nil {
		return err
	}
	if m.rc.rank != hr.leader || !rd.consSent || hr.applied {
		return fmt.Errorf("received for round %d out of turn", id)
	}
	hr.applied = true
	b := rdc.RoundRef{Round: id}.Encode()
	for _, r := range hr.ranks {
		e.send(e.members[r], rdc.KindApply, b)
	}
	return nil
}

func (e *engine) done(m *member, d rdc.Done) error {
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
		e.send(e.members[q], rdc.KindResult, rdc.Result{Round: d.Round, Diff2: diff[i], Pre2: pre[i], Post2: post2, Bytes: rd.bytes}.Encode())
	}
	rd.finished++
	if rd.finished == len(rd.hosts) {
		e.cur = nil
		e.complete(rd.id)
		e.log.Debug("round done", "round", rd.id)
	}
	return nil
}

func (s *Server) geometryNow() rdc.Hello {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.geometry
}
