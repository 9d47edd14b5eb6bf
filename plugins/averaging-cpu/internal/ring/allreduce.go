package ring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

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
	// Prepare, when set, is called once for each chunk of the shard of
	// Own this leader sends first, elements [lo, hi), before that chunk is
	// tagged: a leader that builds Own as it goes (folds it) need not
	// finish the shard before the ring starts. It runs on a goroutine of
	// its own while earlier chunks are on the wire; the rest of Own must
	// be final before Reduce reads it.
	Prepare func(lo, hi int)
	// Final, when set, is called once for each chunk of Dst whose
	// elements [lo, hi) hold their final value: the chunks this leader
	// finished itself, after Reduce, and those the all-gather brings, once
	// verified. It runs on the receive side while later chunks move, so a
	// leader can use the result as it lands; it must not write Dst.
	Final func(lo, hi int)
}

// Shard is the element range [lo, hi) of shard k of n elements over hosts.
func Shard(n, hosts, k int) (lo, hi int) { return numeric.Split(n, hosts, k) }

// AllReduce runs the ring: Hosts−1 reduce-scatter steps (send a shard to
// out, receive the next into Dst and reduce it with Own), then Hosts−1
// all-gather steps (pass the finished shards on). Sending and receiving
// run on goroutines of their own with no barrier between steps: a step
// sends the shard the previous one received, chunk by chunk as each
// chunk is verified and reduced, so the ring is one pipeline from the first
// frame to the last. When ctx ends, or either link fails, both links
// close, so the neighbours fail their steps too and the whole ring stops
// within a read deadline. It returns the frame bytes moved on both links by
// this call. Links that served a successful call serve the next one: the
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
	shard := func(k int) (int, int) {
		lo, hi := Shard(n, h, k)
		return lo * es, hi * es
	}
	mod := func(x int) int { return ((x % h) + h) % h }
	steps := 2 * (h - 1)
	// recvShard is the shard step s receives; step s+1 sends it on.
	recvShard := func(s int) int {
		if s < h-1 {
			return mod(i - s - 1)
		}
		return mod(i - (s - (h - 1)))
	}
	// ready carries one value per chunk received, verified and reduced, for
	// the next step to send; it holds them all, so the receiver never
	// waits on the sender.
	chunks := 0
	for s := range steps {
		lo, hi := shard(recvShard(s))
		chunks += (hi - lo + Chunk(hi-lo) - 1) / Chunk(hi-lo)
	}
	ready := make(chan struct{}, chunks)
	// prepared carries one value per chunk of the first shard Prepare
	// finished; quit stops the preparer early when the ring failed.
	var prepared chan struct{}
	quit := make(chan struct{})
	var prep sync.WaitGroup
	defer func() {
		close(quit)
		prep.Wait()
	}()
	if j.Prepare != nil {
		lo, hi := shard(i)
		cs := Chunk(hi - lo)
		prepared = make(chan struct{}, (hi-lo+cs-1)/cs)
		prep.Go(func() {
			for a := lo; a < hi; a += cs {
				select {
				case <-quit:
					return
				default:
				}
				j.Prepare(a/es, min(hi, a+cs)/es)
				prepared <- struct{}{}
			}
		})
	}
	sent := make(chan error, 1)
	go func() {
		var err error
		for s := range steps {
			var send []byte
			var rdy <-chan struct{}
			if s == 0 {
				lo, hi := shard(i)
				send, rdy = j.Own[lo:hi], prepared
			} else {
				lo, hi := shard(recvShard(s - 1))
				send, rdy = j.Dst[lo:hi], ready
			}
			if err = out.Send(uint32(s), send, rdy); err != nil {
				err = fmt.Errorf("step %d: %w", s, err)
				in.Close() // the ring is broken: fail the receive at once
				break
			}
		}
		sent <- err
	}()
	rerr := func() error {
		defer close(ready) // stops a sender waiting for what will not come
		for s := range steps {
			lo, hi := shard(recvShard(s))
			final := s >= h-2 && j.Final != nil
			reduce := func(a, b int) {
				if s < h-1 {
					j.Reduce((lo+a)/es, (lo+b)/es, s == h-2)
				}
				ready <- struct{}{}
				if final {
					j.Final((lo+a)/es, (lo+b)/es)
				}
			}
			if err := in.Receive(uint32(s), j.Dst[lo:hi], reduce); err != nil {
				out.Close() // fail the send at once
				return fmt.Errorf("step %d: %w", s, err)
			}
		}
		return nil
	}()
	serr := <-sent
	err := rerr
	if err == nil || errors.Is(err, net.ErrClosed) && serr != nil {
		err = serr // the sender's error is the cause when it closed the receive
	}
	if err != nil {
		in.Close()
		out.Close()
		if cerr := ctx.Err(); cerr != nil {
			return 0, fmt.Errorf("ring: host %d: %w (%w)", i, cerr, err)
		}
		return 0, fmt.Errorf("ring: host %d: %w", i, err)
	}
	return out.Bytes() + in.Bytes() - moved0, nil
}
