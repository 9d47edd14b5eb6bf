package reduce

// The cross-host sum: when the cohort spans several hosts, each host leader
// sends its folded sum and the server adds them, divides once by the total
// weight and sends the consensus back to every leader.

import (
	"fmt"

	rdc "github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

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
