package ring

import (
	"context"
	"fmt"

	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// Job is one leader's part of a ring all-reduce over Hosts leaders.
type Job struct {
	Host, Hosts int
	// ElemSize is the bytes of one element on the wire.
	ElemSize int
	// Own is this host's contribution; Dst receives the result. Both hold
	// the same number of elements and must not overlap.
	Own, Dst []byte
	// Reduce sets Dst's elements [lo, hi) to their received value plus
	// Own's, and, when last, to the final result (scaled): it runs once per
	// verified chunk, on the shard this leader reduces in a step.
	Reduce func(lo, hi int, last bool)
}

// Shard is the element range [lo, hi) of shard k of n elements over hosts.
func Shard(n, hosts, k int) (lo, hi int) { return numeric.Split(n, hosts, k) }

// AllReduce runs the ring: Hosts−1 reduce-scatter steps (send a shard to
// out, receive the next into Dst and reduce it with Own), then Hosts−1
// all-gather steps (pass the finished shards on). Each step sends and
// receives at once. When ctx ends, or either link fails, both links close,
// so the neighbours fail their steps too and the whole ring stops within a
// read deadline. It returns the frame bytes moved on both links by this
// call. Links that served a successful call serve the next one: the
// frames' sequence numbers run on, so no frame of one call passes as
// another's; after an error both are closed.
func AllReduce(ctx context.Context, out, in *Link, j Job) (uint64, error) {
	h, i := j.Hosts, j.Host
	if h < 2 || i < 0 || i >= h || len(j.Own) != len(j.Dst) || j.ElemSize <= 0 || len(j.Dst)%j.ElemSize != 0 {
		return 0, fmt.Errorf("ring: job of host %d of %d with %d and %d bytes of %d-byte elements", i, h, len(j.Own), len(j.Dst), j.ElemSize)
	}
	moved0 := out.Bytes() + in.Bytes()
	stop := closeOn(ctx, out, in)
	defer stop()
	n := len(j.Dst) / j.ElemSize
	es := j.ElemSize
	bytes := func(k int) (int, int) {
		lo, hi := Shard(n, h, k)
		return lo * es, hi * es
	}
	mod := func(x int) int { return ((x % h) + h) % h }
	for s := range 2 * (h - 1) {
		var send []byte
		var rk int
		rs := s < h-1
		if rs {
			lo, hi := bytes(mod(i - s))
			send = j.Dst[lo:hi]
			if s == 0 {
				send = j.Own[lo:hi]
			}
			rk = mod(i - s - 1)
		} else {
			g := s - (h - 1)
			lo, hi := bytes(mod(i + 1 - g))
			send = j.Dst[lo:hi]
			rk = mod(i - g)
		}
		lo, hi := bytes(rk)
		var reduce func(a, b int)
		if rs {
			last := s == h-2
			reduce = func(a, b int) { j.Reduce((lo+a)/es, (lo+b)/es, last) }
		} else {
			reduce = func(int, int) {}
		}
		sent := make(chan error, 1)
		go func() { sent <- out.Send(uint32(s), send) }()
		rerr := in.Receive(uint32(s), j.Dst[lo:hi], reduce)
		if rerr != nil {
			out.Close() // fail the send at once
		}
		serr := <-sent
		if rerr == nil {
			rerr = serr
		}
		if rerr != nil {
			in.Close()
			out.Close()
			if cerr := ctx.Err(); cerr != nil {
				return 0, fmt.Errorf("ring: step %d of host %d: %w (%w)", s, i, cerr, rerr)
			}
			return 0, fmt.Errorf("ring: step %d of host %d: %w", s, i, rerr)
		}
	}
	return out.Bytes() + in.Bytes() - moved0, nil
}
