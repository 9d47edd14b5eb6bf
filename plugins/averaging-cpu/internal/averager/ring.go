package averager

// The cross-host sum: each host leader runs a ring all-reduce of its host's
// fold with the other leaders (internal/ring), while the round's goroutine
// keeps listening to the reduce server, whose Fail stops the ring
// at once.

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/plugins/averaging-cpu/internal/ring"
	"github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// ringLinks are a leader's links to its ring neighbours for the rounds of
// topology gen: opening them costs a TCP connect and a handshake (a TLS one
// too when configured), so they stay up until a round fails or the
// topology changes. A failed round drops them on every leader (the server
// fails it everywhere), so no leader reads a frame its neighbour sent for
// an abandoned round: those die with the socket.
type ringLinks struct {
	gen     uint64
	out, in *ring.Link
}

// dropLinks closes the leader's ring links, if any.
func (c *client) dropLinks() {
	if c.links.out != nil {
		c.links.out.Close()
		c.links.in.Close()
	}
	c.links = ringLinks{}
}

// listenRing listens for ring links on the first free port of
// [port, port+64), or on any port when port is 0.
func listenRing(port int, k ring.Keys, run [16]byte, timeout time.Duration) (*ring.Listener, error) {
	if port == 0 {
		return ring.Listen(":0", k, run, timeout)
	}
	var err error
	for p := port; p < port+64; p++ {
		var l *ring.Listener
		if l, err = ring.Listen(fmt.Sprintf(":%d", p), k, run, timeout); err == nil {
			return l, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("averager: ring_port %d: %w", port, err)
}

// during runs f on a goroutine of its own while this one keeps reading the
// reduce server: a Fail of this round, an abort or ctx's end cancels f's
// context, and during returns once f has.
func (r *rnd) during(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	stop := func(err error) error {
		cancel()
		<-done
		return err
	}
	for {
		select {
		case err := <-done:
			return err
		case m := <-r.c.inbox:
			if _, err := r.take(m); err != nil {
				return stop(err)
			}
		case <-r.abortCh:
			return stop(fmt.Errorf("%w: %s", ErrAborted, r.reason()))
		case <-r.ctx.Done():
			return stop(r.ctx.Err())
		}
	}
}

// allReduce is the host leader's part of the round's cross-host sum: the
// host's fold (all zeros when nobody here trained) goes round the ring,
// built chunk by chunk from the host's arenas as the ring takes it, and
// the consensus lands in the fold segment's consensus area, each chunk
// applied to the host's arenas as soon as it is final, adding the
// divergence sums to applied. It returns the bytes its links moved and
// the time the folding and applying took on the ring's receive side.
func (r *rnd) allReduce(j *job, applied *numeric.Stats) (uint64, time.Duration, error) {
	c, t := r.c, r.c.topo
	own, dst := c.sendArea(j.wire), c.consArea(j.wire)
	if !j.needFold {
		clear(own)
	}
	ps, bs := float32(1), float32(1)
	if !j.plan.Broadcast {
		ps = float32(1 / j.plan.TotalWeight)
		bs = 0
		if j.plan.TotalMovers > 0 {
			bs = float32(1 / j.plan.TotalMovers)
		}
	}
	// reduce folds the host's elements [lo, hi) and sets dst's to the
	// received partial sum plus that fold, scaled once on the last step:
	// parameters by 1/Σweight, buffers by 1/Σmovers. (The ring's Prepare
	// folds the first shard chunk by chunk as it sends it.)
	var took time.Duration
	timed := func(f func()) {
		t0 := time.Now()
		f()
		took += time.Since(t0)
	}
	reduce := func(lo, hi int, last bool) {
		if j.needFold {
			timed(func() { j.chunk(phaseFold, lo, hi, nil) })
		}
		for _, part := range [2][2]int{{lo, min(hi, c.np)}, {max(lo, c.np), hi}} {
			a, b := part[0], part[1]
			if a >= b {
				continue
			}
			scale := float32(1)
			if last {
				scale = ps
				if a >= c.np {
					scale = bs
				}
			}
			switch {
			case j.delta && a < c.np && scale != 0:
				// This hop's rounding joins the host's residual: any
				// host may send the cohort's dropped change back.
				d, o := numeric.Uint16s(dst), numeric.Uint16s(own)
				numeric.CombineBF16Residual(d[a:b], d[a:b], o[a:b], scale, j.resid[a:b])
			case j.wire == reduce.WireBF16:
				d, o := numeric.Uint16s(dst), numeric.Uint16s(own)
				numeric.CombineBF16(d[a:b], [][]uint16{d[a:b], o[a:b]}, scale)
			default:
				d, o := numeric.Float32s(dst), numeric.Float32s(own)
				numeric.Combine(d[a:b], [][]float32{d[a:b], o[a:b]}, scale)
			}
		}
	}
	rj := ring.Job{Host: int(t.host), Hosts: int(t.hosts), ElemSize: int(j.wire.Size()), Own: own, Dst: dst, Reduce: reduce}
	if j.needFold {
		rj.Prepare = func(lo, hi int) { j.chunk(phaseFold, lo, hi, nil) }
	}
	rj.Final = func(lo, hi int) { timed(func() { j.chunk(phaseApplyConsensus, lo, hi, applied) }) }
	h := ring.Hello{From: t.host, To: (t.host + 1) % t.hosts, Hosts: t.hosts, Topology: t.gen, Round: r.id, Run: c.run}
	pred := (t.host + t.hosts - 1) % t.hosts
	var moved uint64
	err := r.during(func(ctx context.Context) error {
		if c.links.out == nil || c.links.gen != t.gen {
			c.dropLinks()
			out, err := ring.Dial(ctx, t.leaders[h.To], c.ringKeys, h, c.cfg.timeout)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
			in, err := c.ring.Accept(actx, pred, t.gen, r.id)
			cancel()
			if err != nil {
				out.Close()
				return err
			}
			c.links = ringLinks{gen: t.gen, out: out, in: in}
		}
		var err error
		moved, err = ring.AllReduce(ctx, c.links.out, c.links.in, rj)
		return err
	})
	if err != nil {
		c.dropLinks()
		return 0, 0, fmt.Errorf("round %d across %d hosts: %w", r.id, t.hosts, err)
	}
	return moved, took, nil
}
