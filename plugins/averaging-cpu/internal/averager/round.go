package averager

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// errServer marks an error the server decided (a failed round): no need to
// tell it.
type serverFail struct{ reason string }

func (e *serverFail) Error() string { return e.reason }
func (e *serverFail) Unwrap() error { return ErrRoundFailed }

// rnd is one round in progress on this rank.
type rnd struct {
	c       *client
	ctx     context.Context
	id      uint64
	abortCh <-chan struct{}
	reason  func() string
	wait    time.Duration
	// skip are kinds of this round's messages the rank does not wait for
	// (a leader's Send and Apply): taken where they arrive and noted in
	// seen.
	skip []reduce.Kind
	seen []reduce.Kind
}

// skipped reports whether a message of kind k in skip came.
func (r *rnd) skipped(k reduce.Kind) bool { return slices.Contains(r.seen, k) }

// next waits for the server's next message for this round of one of the
// wanted kinds, applying topologies and skipping what is left of earlier
// rounds.
func (r *rnd) next(want ...reduce.Kind) (inMsg, error) {
	c := r.c
	t0 := time.Now()
	defer func() { r.wait += time.Since(t0) }()
	for {
		if c.fatal != nil {
			return inMsg{}, c.fatal
		}
		var m inMsg
		select {
		case m = <-c.inbox:
		case <-r.abortCh:
			return inMsg{}, fmt.Errorf("%w: %s", ErrAborted, r.reason())
		case <-r.ctx.Done():
			return inMsg{}, r.ctx.Err()
		}
		if ok, err := r.take(m, want...); ok || err != nil {
			return m, err
		}
	}
}

// take handles one message from the server: true when it is one of the
// wanted kinds for this round, an error when it ends the round, neither
// when it is a topology (applied), one the round skips (noted), or what is
// left of an earlier round.
func (r *rnd) take(m inMsg, want ...reduce.Kind) (bool, error) {
	c := r.c
	switch {
	case m.err != nil:
		c.fatal = fmt.Errorf("data channel to the reduce server lost: %w", m.err)
		return false, c.fatal
	case m.kind == reduce.KindTopology:
		return false, c.applyTopology(m.topo)
	case m.round < r.id:
		return false, nil // the tail of a round that ended here earlier
	case m.round == r.id && slices.Contains(want, m.kind):
		return true, nil
	case m.round == r.id && slices.Contains(r.skip, m.kind):
		r.seen = append(r.seen, m.kind)
		return false, nil
	case m.round == r.id && m.kind == reduce.KindFail:
		return false, &serverFail{reason: "the reduce server failed the round: " + m.fail.Reason}
	}
	return false, fmt.Errorf("reduce server sent %v for round %d while this rank waits for %v of round %d", m.kind, m.round, want, r.id)
}

func (r *rnd) send(kind reduce.Kind, parts ...[]byte) error {
	if err := r.c.conn.Send(r.ctx, kind, parts...); err != nil {
		r.c.fatal = fmt.Errorf("data channel to the reduce server lost: %w", err)
		return r.c.fatal
	}
	return nil
}

// round runs one averaging round. root is the broadcast root's global
// rank.
func (c *client) round(ctx context.Context, rq plugin.Round, root uint32, sess uint64, abortCh <-chan struct{}, reason func() string) (res plugin.RoundResult, err error) {
	if c.fatal != nil {
		return res, c.fatal
	}
	start := time.Now()
	bytes0 := c.conn.BytesSent() + c.conn.BytesReceived()
	r := &rnd{c: c, ctx: ctx, id: rq.Round, abortCh: abortCh, reason: reason}
	weight := numeric.GammaMass(rq.Steps, c.cfg.gamma)
	outerOn := c.outer != nil
	var planned, stepping bool
	defer func() {
		if err == nil {
			return
		}
		// The round may have left frames of its ring in flight: its links
		// are of no use to the next.
		c.dropLinks()
		var sf *serverFail
		if !errors.As(err, &sf) && !errors.Is(err, ErrAborted) && c.fatal == nil {
			// Tell the server, so no peer waits for this rank.
			c.conn.SendAsync(reduce.KindAbort, reduce.Abort{Round: rq.Round, Reason: err.Error()}.Encode())
		}
		if planned && stepping {
			// Some slices of the outer state may have stepped: restart it.
			c.outerSteps, c.outerID = 0, [8]byte{}
		}
	}()
	ann := reduce.Announce{Round: rq.Round, Session: sess, Steps: rq.Steps, Weight: weight, Broadcast: rq.Broadcast, Root: root}
	if outerOn {
		ann.OuterSteps, ann.OuterID = c.outerSteps, c.outerID
	}
	if err := r.send(reduce.KindAnnounce, ann.Encode()); err != nil {
		return res, err
	}
	m, err := r.next(reduce.KindPlan)
	if err != nil {
		return res, err
	}
	plan := m.plan
	planned = true
	if err := c.checkPlan(plan, root); err != nil {
		return res, err
	}
	res.Weight, res.TotalWeight = weight, plan.TotalWeight
	if plan.Broadcast {
		res.Weight, res.TotalWeight = 0, 1
		if c.rank == plan.Root {
			res.Weight = 1
		}
	}
	if !plan.Realized {
		norm := math.Sqrt(c.ownSquares())
		res.PreNorm, res.PostNorm = norm, norm
		res.TotalMS = plugin.Milliseconds(time.Since(start))
		res.WaitMS = plugin.Milliseconds(r.wait)
		res.BytesMoved = c.conn.BytesSent() + c.conn.BytesReceived() - bytes0
		return res, nil
	}
	stepping = outerOn && !plan.Broadcast
	seed := plan.Seed || c.outerSteps == 0 || c.loneRound(plan)
	j := c.job(plan, seed)
	var reduceTime time.Duration
	var st numeric.Stats
	var ringBytes uint64
	if plan.Hosts == 1 {
		t := time.Now()
		st = j.run()
		reduceTime += time.Since(t)
	} else {
		// Each host folds and applies inside the ring: its leader starts
		// the ring at once, folds each chunk of its host's ranks as the
		// ring sends or adds it, and applies each chunk of the consensus
		// to every rank of the host as soon as it is final, while later
		// chunks still move; no pass over the parameters is left before
		// the first byte leaves or after the last arrives. The host's
		// other ranks wait for Apply, which the server sends once the
		// leader has the whole consensus in place. (Every rank published
		// before the server planned the round, so the leader may read
		// their arenas from the Plan on. A ring that fails midway leaves
		// the host part averaged, which the round's retry takes as it is.)
		if err := r.send(reduce.KindFolded, reduce.RoundRef{Round: r.id}.Encode()); err != nil {
			return res, err
		}
		st = numeric.NewStats(len(j.ranks))
		if j.p == 0 {
			j.resid = c.residual(j)
			// The leader's Send (all the host's ranks folded, which here
			// means they are in the round) may come during the ring, and
			// its Apply brings nothing.
			r.skip = []reduce.Kind{reduce.KindSend, reduce.KindApply}
			moved, took, err := r.allReduce(j, &st)
			if err != nil {
				return res, err
			}
			ringBytes = moved
			reduceTime += took
			// The server takes Received once the host's ranks all folded.
			if !r.skipped(reduce.KindSend) {
				if _, err := r.next(reduce.KindSend); err != nil {
					return res, err
				}
			}
			if err := r.send(reduce.KindReceived, reduce.RoundRef{Round: r.id}.Encode()); err != nil {
				return res, err
			}
		} else if _, err := r.next(reduce.KindApply); err != nil {
			return res, err
		}
	}
	done := reduce.Done{Round: r.id, Post2: st.Post2}
	for i, q := range j.ranks {
		done.Parts = append(done.Parts, reduce.Partial{Rank: q, Diff2: st.Diff2[i], Pre2: st.Pre2[i]})
	}
	if err := r.send(reduce.KindDone, done.Encode()); err != nil {
		return res, err
	}
	m, err = r.next(reduce.KindResult)
	if err != nil {
		return res, err
	}
	if stepping {
		if seed {
			c.outerSteps, c.outerID = 1, [8]byte{}
		} else {
			c.outerSteps++
		}
	}
	if j.resid != nil {
		c.resid = residual{v: c.resid.v, ok: true, gen: c.topo.gen, steps: c.outerSteps}
	}
	res.Realized = true
	res.PreNorm, res.PostNorm = math.Sqrt(m.res.Pre2), math.Sqrt(m.res.Post2)
	if res.PostNorm > 1e-10 {
		res.Divergence = math.Sqrt(m.res.Diff2) / res.PostNorm
	}
	res.ReduceMS, res.WaitMS, res.TotalMS = plugin.Milliseconds(reduceTime), plugin.Milliseconds(r.wait), plugin.Milliseconds(time.Since(start))
	res.BytesMoved = c.conn.BytesSent() + c.conn.BytesReceived() - bytes0 + ringBytes
	return res, nil
}

// residual is what the leader's roundings dropped, to send in this
// round: carried on from the previous round when this rank led its host
// in it under the same topology, else zeros (the residual of a round that
// failed, or of another topology, is not known to be this cohort's).
// nil when the round sends no differences. The round marks it current
// once it succeeds.
func (c *client) residual(j *job) []float32 {
	r := &c.resid
	carried := r.ok && r.gen == c.topo.gen && r.steps == c.outerSteps
	r.ok = false
	if !j.delta {
		return nil
	}
	if len(r.v) != c.np {
		r.v = make([]float32, c.np)
	} else if !carried {
		clear(r.v)
	}
	return r.v
}

// loneRound reports a smoothing round whose one member keeps its values:
// seeding the filter from them leaves the arena as it is, and starts the
// filter afresh should the cohort grow again.
func (c *client) loneRound(p reduce.Plan) bool {
	return c.cfg.smoothing && p.Hosts == 1 && len(p.Parts) == 1
}

// checkPlan refuses a plan that does not match what this rank knows.
func (c *client) checkPlan(p reduce.Plan, root uint32) error {
	if c.topo == nil || p.Topology != c.topo.gen {
		return fmt.Errorf("plan of round %d is for topology %d, this rank has %v", p.Round, p.Topology, c.topo)
	}
	if p.Hosts != c.topo.hosts {
		return fmt.Errorf("plan of round %d spans %d hosts, the topology %d", p.Round, p.Hosts, c.topo.hosts)
	}
	if len(p.Parts) != len(c.topo.ranks) {
		return fmt.Errorf("plan of round %d has %d ranks on this host, the topology %d", p.Round, len(p.Parts), len(c.topo.ranks))
	}
	for i, q := range p.Parts {
		if q.Rank != c.topo.ranks[i] {
			return fmt.Errorf("plan of round %d lists rank %d where the topology has %d", p.Round, q.Rank, c.topo.ranks[i])
		}
	}
	if p.Broadcast && p.Root != root {
		return fmt.Errorf("plan of round %d broadcasts from rank %d, this rank asked for %d", p.Round, p.Root, root)
	}
	return nil
}

// ownSquares is Σ x² over this rank's parameters.
func (c *client) ownSquares() float64 {
	own := c.floats(c.rank)
	var mu sync.Mutex
	var total float64
	numeric.Parallel(c.np, c.threads(1), func(lo, hi int) {
		var s float64
		c.pieces(lo, hi, func(sp span, x0, x1 int) {
			o := sp.off + x0 - sp.idx
			s += numeric.SumSquares(own[o : o+x1-x0])
		})
		mu.Lock()
		total += s
		mu.Unlock()
	})
	return total
}

// pieces calls f for every part of a span inside reduce elements [lo, hi).
func (c *client) pieces(lo, hi int, f func(sp span, x0, x1 int)) {
	for _, sp := range c.spans {
		a, b := max(lo, sp.idx), min(hi, sp.idx+sp.n)
		if a < b {
			f(sp, a, b)
		}
	}
}

// The host's fold segment holds 8 bytes per element (n elements):
//
//	[0, 4n)   the f32 fold, sent as is on an f32 wire and in broadcasts
//	[4n, 6n)  its bf16 encoding, sent on a bf16 wire
//	[4n, 8n)  an f32 consensus, summed by the leader's ring
//	[6n, 8n)  a bf16 consensus
//
// Each wire's fold and consensus areas are disjoint: the ring reads the one
// while it writes the other.
func (c *client) sendArea(w reduce.Wire) []byte {
	n := c.np + c.nb
	b := c.fold.Bytes()
	if w == reduce.WireBF16 {
		return b[4*n : 6*n]
	}
	return b[:4*n]
}

func (c *client) consArea(w reduce.Wire) []byte {
	n := c.np + c.nb
	b := c.fold.Bytes()
	if w == reduce.WireBF16 {
		return b[6*n : 8*n]
	}
	return b[4*n : 8*n]
}

type phase int

const (
	phaseApply          phase = iota // single host: reduce from the arenas
	phaseFold                        // several hosts: fold into the segment (a leader, in the ring)
	phaseApplyConsensus              // several hosts: apply the consensus (a leader, in the ring)
)

// job is this rank's share of a round on its host.
type job struct {
	c          *client
	plan       reduce.Plan
	ranks      []uint32
	arenas     [][]float32
	w, m       []float64 // parameter and buffer weights per host rank
	p          int       // this rank's slice
	rootIdx    int       // the broadcast root among the host's ranks, or -1
	needFold   bool
	hostWeight float64
	seed       bool
	wire       reduce.Wire // of this round's folds and consensus
	// delta: the parameters cross as differences from the outer state's
	// prev, the previous global parameters (a bf16 wire's, numeric/delta.go),
	// with the host's rounding residual resid.
	delta bool
	resid []float32
}

func (c *client) job(p reduce.Plan, seed bool) *job {
	j := &job{c: c, plan: p, rootIdx: -1, seed: seed, wire: c.cfg.wire}
	// A broadcast must be exact, and a seeding round has no previous
	// global parameters every host agrees on to send differences from:
	// both cross in f32. Every host sees the same plan and the same seed.
	if p.Broadcast || (seed && j.wire == reduce.WireBF16) {
		j.wire = reduce.WireF32
	}
	j.delta = j.wire == reduce.WireBF16 && c.outer != nil
	for i, q := range p.Parts {
		j.ranks = append(j.ranks, q.Rank)
		j.arenas = append(j.arenas, c.floats(q.Rank))
		j.w = append(j.w, q.Weight)
		mv := 0.0
		if q.Weight > 0 {
			mv = 1
		}
		j.m = append(j.m, mv)
		j.hostWeight += q.Weight
		if q.Rank == c.rank {
			j.p = i
		}
		if p.Broadcast && q.Rank == p.Root {
			j.rootIdx = i
		}
	}
	if p.Broadcast {
		j.needFold = j.rootIdx >= 0
	} else {
		j.needFold = j.hostWeight > 0
	}
	return j
}

// run does this rank's slice of a single-host round with its threads and
// returns the divergence sums over the parameters.
func (j *job) run() numeric.Stats {
	l := len(j.ranks)
	lo, hi := numeric.Split(j.c.np+j.c.nb, l, j.p)
	st := numeric.NewStats(l)
	j.parallel(phaseApply, lo, hi, j.c.threads(l), &st)
	return st
}

// span does phase ph over reduce elements [lo, hi) of every rank of the
// host, on the calling goroutine, adding the parameters' divergence sums
// to st (which a fold, having none, may leave nil).
func (j *job) span(ph phase, lo, hi int, st *numeric.Stats) {
	c := j.c
	l := len(j.ranks)
	junk := numeric.NewStats(l)
	dst := make([][]float32, l)
	c.pieces(lo, hi, func(sp span, x0, x1 int) {
		o := sp.off + x0 - sp.idx
		for i, ar := range j.arenas {
			dst[i] = ar[o : o+x1-x0]
		}
		switch ph {
		case phaseFold:
			j.fold(dst, sp, x0, x1)
		default:
			ap := numeric.Apply{Dst: dst}
			if ph == phaseApplyConsensus {
				j.consensus(&ap, sp, x0, x1)
			} else if j.plan.Broadcast {
				ap.Root = j.rootIdx
			} else if sp.param {
				ap.Weights, ap.Scale = j.w, 1/j.plan.TotalWeight
			} else {
				ap.Weights, ap.Scale = j.m, 1/j.plan.TotalMovers
			}
			if !j.plan.Broadcast {
				ap.Blend = c.cfg.alpha
				if sp.param && c.outer != nil {
					ob := numeric.Float32s(c.outer.Bytes())
					ap.Outer, ap.Prev, ap.Vel, ap.Seed = c.cfg.outer, ob[x0:x1], ob[c.np+x0:c.np+x1], j.seed
				}
			}
			if sp.param {
				ap.Run(st)
			} else {
				ap.Run(&junk)
			}
		}
	})
}

// chunk does phase ph (a fold or the consensus's apply) over reduce
// elements [lo, hi) of every rank of the host, for the ring: split over up
// to as many goroutines as the host has ranks (a one-rank host's stays on
// the ring's goroutine: more, on a busy CPU, only cost), adding the
// parameters' divergence sums to st (nil for a fold).
func (j *job) chunk(ph phase, lo, hi int, st *numeric.Stats) {
	j.parallel(ph, lo, hi, len(j.ranks), st)
}

// parallel does phase ph over reduce elements [lo, hi) with up to threads
// goroutines, adding the parameters' divergence sums to st (nil: none) in
// element order, so they come out the same however the work was split.
func (j *job) parallel(ph phase, lo, hi, threads int, st *numeric.Stats) {
	l := len(j.ranks)
	type part struct {
		at int
		st numeric.Stats
	}
	if st == nil {
		numeric.Parallel(hi-lo, threads, func(a, b int) { j.span(ph, lo+a, lo+b, nil) })
		return
	}
	var mu sync.Mutex
	var parts []part
	numeric.Parallel(hi-lo, threads, func(a, b int) {
		p := part{at: a, st: numeric.NewStats(l)}
		j.span(ph, lo+a, lo+b, &p.st)
		mu.Lock()
		parts = append(parts, p)
		mu.Unlock()
	})
	slices.SortFunc(parts, func(x, y part) int { return x.at - y.at })
	for _, p := range parts {
		st.Add(p.st)
	}
}

// fold writes the host's weighted sum of reduce elements [x0, x1) into the
// fold segment, or its bf16 encoding when the wire is bf16 (for the
// parameters, their sum of changes since the previous round).
func (j *job) fold(src [][]float32, sp span, x0, x1 int) {
	n := j.c.np + j.c.nb
	seg := j.c.fold.Bytes()
	f32 := numeric.Float32s(seg[:4*n])[x0:x1]
	var b16 []uint16
	if j.wire == reduce.WireBF16 {
		b16 = numeric.Uint16s(seg[4*n : 6*n])[x0:x1]
	}
	switch {
	case j.plan.Broadcast && b16 != nil:
		numeric.FoldRoot(nil, b16, src, j.rootIdx, nil)
	case j.plan.Broadcast:
		numeric.FoldRoot(f32, nil, src, j.rootIdx, nil)
	default:
		w := j.w
		if !sp.param {
			w = j.m
		}
		switch {
		case b16 != nil && j.delta && sp.param:
			ob := numeric.Float32s(j.c.outer.Bytes())
			numeric.FoldDeltaBF16(b16, src, w, ob[x0:x1], j.resid[x0:x1])
		case b16 != nil:
			numeric.FoldBF16(b16, src, w, nil)
		default:
			numeric.Fold(f32, src, w, nil)
		}
	}
}

// consensus points ap at the received consensus for elements [x0, x1) of
// span sp.
func (j *job) consensus(ap *numeric.Apply, sp span, x0, x1 int) {
	cons := j.c.consArea(j.wire)
	if j.wire == reduce.WireBF16 {
		ap.ConsBF16 = numeric.Uint16s(cons)[x0:x1]
		if j.delta && sp.param {
			// prev is read before the outer step overwrites it.
			ap.Base = numeric.Float32s(j.c.outer.Bytes())[x0:x1]
		}
	} else {
		ap.ConsF32 = numeric.Float32s(cons)[x0:x1]
	}
}
