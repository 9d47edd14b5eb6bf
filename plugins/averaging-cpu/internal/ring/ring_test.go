package ring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

var testKey = bytes.Repeat([]byte{3}, 32)

// bed is h leaders' listeners and the links of one round.
type bed struct {
	keys Keys
	lns  []*Listener
	out  []*Link
	in   []*Link
}

func newBed(t testing.TB, h int, timeout time.Duration) *bed {
	t.Helper()
	k, err := DeriveKeys(testKey)
	if err != nil {
		t.Fatal(err)
	}
	b := &bed{keys: k}
	for range h {
		l, err := Listen("127.0.0.1:0", k, [16]byte{1}, timeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		b.lns = append(b.lns, l)
	}
	b.out, b.in = make([]*Link, h), make([]*Link, h)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range h {
		to := (i + 1) % h
		hello := Hello{From: uint32(i), To: uint32(to), Hosts: uint32(h), Topology: 1, Round: 7, Run: [16]byte{1}}
		if b.out[i], err = Dial(ctx, fmt.Sprintf("127.0.0.1:%d", b.lns[to].Port()), k, hello, timeout); err != nil {
			t.Fatal(err)
		}
		if b.in[to], err = b.lns[to].Accept(ctx, uint32(i), 1, 7); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := range h {
			b.out[i].Close()
			b.in[i].Close()
		}
	})
	return b
}

// f32Job sums f32 contributions and scales the result.
func f32Job(i, h int, src []float32, scale float32) (Job, []float32) {
	ob, db := make([]byte, 4*len(src)), make([]byte, 4*len(src))
	own, dst := numeric.Float32s(ob), numeric.Float32s(db)
	copy(own, src)
	return Job{Host: i, Hosts: h, ElemSize: 4, Own: ob, Dst: db, Reduce: func(lo, hi int, last bool) {
		for x := lo; x < hi; x++ {
			dst[x] += own[x]
			if last {
				dst[x] *= scale
			}
		}
	}}, dst
}

// TestAllReduce: every leader ends with the scaled sum of all
// contributions, against a float64 reference, for shards that do not
// divide evenly (and fewer elements than hosts), idle hosts (all-zero
// contributions) and multi-chunk shards.
func TestAllReduce(t *testing.T) {
	cases := []struct {
		hosts, n int
		idle     []int
	}{
		{2, 1001, nil},
		{3, 1000, []int{1}},
		{4, 3, nil},
		{4, 1003, []int{0, 3}},
		{2, ChunkSize/2 + 7, []int{1}}, // several chunks per shard
		{5, 997, []int{2}},
		{5, 0, nil},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("hosts=%d/n=%d/idle=%v", c.hosts, c.n, c.idle), func(t *testing.T) {
			b := newBed(t, c.hosts, 5*time.Second)
			rng := rand.New(rand.NewPCG(uint64(c.hosts), uint64(c.n)))
			// Two calls on the same links, as a topology's rounds: the
			// second must not mistake anything of the first for its own.
			for call := range 2 {
				own := make([][]float32, c.hosts)
				ref := make([]float64, c.n)
				for i := range own {
					own[i] = make([]float32, c.n)
					idle := false
					for _, x := range c.idle {
						idle = idle || x == i
					}
					for k := range own[i] {
						if !idle {
							own[i][k] = float32(rng.NormFloat64())
						}
						ref[k] += float64(own[i][k])
					}
				}
				const scale = 0.25
				dsts := make([][]float32, c.hosts)
				errs := make([]error, c.hosts)
				moved := make([]uint64, c.hosts)
				sent0, got0 := make([]uint64, c.hosts), make([]uint64, c.hosts)
				var wg sync.WaitGroup
				// Final must see every element once, already final.
				finals, atFinal := make([][]int, c.hosts), make([][]float32, c.hosts)
				for i := range c.hosts {
					j, dst := f32Job(i, c.hosts, own[i], scale)
					dsts[i] = dst
					finals[i], atFinal[i] = make([]int, c.n), make([]float32, c.n)
					if call == 1 {
						// The second call builds the first shard it sends
						// as it goes: each chunk only when asked.
						slo, shi := Shard(c.n, c.hosts, i)
						clear(numeric.Float32s(j.Own)[slo:shi])
						prepared := make([]int, c.n)
						j.Prepare = func(lo, hi int) {
							time.Sleep(time.Millisecond) // a sender that did not wait would send zeros
							if lo < slo || hi > shi {
								t.Errorf("host %d: Prepare(%d, %d) outside its first shard [%d, %d)", i, lo, hi, slo, shi)
								return
							}
							for k := lo; k < hi; k++ {
								prepared[k]++
								numeric.Float32s(j.Own)[k] = own[i][k]
							}
						}
						t.Cleanup(func() {
							for k := slo; k < shi; k++ {
								if prepared[k] != 1 {
									t.Errorf("host %d element %d prepared %d times", i, k, prepared[k])
									return
								}
							}
						})
					}
					j.Final = func(lo, hi int) {
						for k := lo; k < hi; k++ {
							finals[i][k]++
							atFinal[i][k] = dst[k]
						}
					}
					sent0[i], got0[i] = b.out[i].Bytes(), b.in[i].Bytes()
					wg.Go(func() { moved[i], errs[i] = AllReduce(context.Background(), b.out[i], b.in[i], j) })
				}
				wg.Wait()
				for i := range c.hosts {
					if errs[i] != nil {
						t.Fatalf("call %d, host %d: %v", call, i, errs[i])
					}
					for k, v := range dsts[i] {
						if want := ref[k] * scale; math.Abs(float64(v)-want) > 1e-5*(1+math.Abs(want)) {
							t.Fatalf("call %d, host %d element %d = %v, want %v", call, i, k, v, want)
						}
						if finals[i][k] != 1 || atFinal[i][k] != v {
							t.Fatalf("call %d, host %d element %d: Final called %d times, saw %v, the result is %v", call, i, k, finals[i][k], atFinal[i][k], v)
						}
					}
				}
				// Each link carries 2(H-1)/H of the data, plus framing, and
				// a call reports its own bytes (both links), not the links'
				// totals.
				perLink := uint64(2*(c.hosts-1)) * uint64(4*c.n) / uint64(c.hosts)
				for i := range c.hosts {
					got := b.out[i].Bytes() - sent0[i]
					if got+uint64(4*c.hosts) < perLink || got > perLink+uint64(4*c.hosts)+uint64(2*c.hosts)*(HeaderSize+gtagSize)*uint64(1+4*c.n/MinChunk) {
						t.Fatalf("call %d: host %d sent %d bytes, want about %d", call, i, got, perLink)
					}
					if in := b.in[i].Bytes() - got0[i]; moved[i] != got+in {
						t.Fatalf("call %d: host %d reports %d bytes moved, its links %d and %d this call", call, i, moved[i], got, in)
					}
				}
			}
		})
	}
}

// TestDeath: when one leader dies mid-round (its sockets close) or hangs
// (silent, sockets open), every other leader fails its round within the
// read deadline, not later; and the coordinator's abort (ctx) stops a
// leader at once.
func TestDeath(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cases := []struct {
		name  string
		fate  func(b *bed, dead int, cancel context.CancelFunc)
		limit time.Duration
	}{
		{"crash", func(b *bed, d int, _ context.CancelFunc) { b.out[d].Close(); b.in[d].Close() }, timeout},
		{"hang", func(*bed, int, context.CancelFunc) {}, 3 * timeout},
		{"abort", func(_ *bed, _ int, cancel context.CancelFunc) { cancel() }, timeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const h, dead = 4, 2
			b := newBed(t, h, timeout)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errs := make([]error, h)
			took := make([]time.Duration, h)
			jobs := make([]Job, h)
			for i := range h {
				jobs[i], _ = f32Job(i, h, make([]float32, 1<<20), 1)
			}
			var wg sync.WaitGroup
			start := time.Now()
			for i := range h {
				if i == dead {
					continue
				}
				wg.Go(func() {
					_, errs[i] = AllReduce(ctx, b.out[i], b.in[i], jobs[i])
					took[i] = time.Since(start)
				})
			}
			time.Sleep(20 * time.Millisecond) // mid-round: the first step is under way
			c.fate(b, dead, cancel)
			wg.Wait()
			for i := range h {
				if i == dead {
					continue
				}
				if errs[i] == nil {
					t.Fatalf("host %d finished a round a leader left", i)
				}
				if took[i] > 20*time.Millisecond+c.limit+200*time.Millisecond {
					t.Fatalf("host %d took %v to fail (deadline %v): %v", i, took[i], timeout, errs[i])
				}
			}
		})
	}
}

// TestTamper: a flipped payload byte fails the receiver's tag check.
func TestTamper(t *testing.T) {
	b := newBed(t, 2, time.Second)
	// Host 0 sends a shard on a link whose sequence is off by one frame:
	// its GMAC sealed a frame the receiver never saw.
	b.out[0].mac.Seal(nil)
	j0, _ := f32Job(0, 2, make([]float32, 100), 1)
	j1, _ := f32Job(1, 2, make([]float32, 100), 1)
	var err0, err1 error
	var wg sync.WaitGroup
	wg.Go(func() { _, err0 = AllReduce(context.Background(), b.out[0], b.in[0], j0) })
	wg.Go(func() { _, err1 = AllReduce(context.Background(), b.out[1], b.in[1], j1) })
	wg.Wait()
	if !errors.Is(err1, authframe.ErrBadTag) {
		t.Fatalf("host 1: %v, want ErrBadTag", err1)
	}
	if err0 == nil {
		t.Fatal("host 0 finished although its successor refused its frame")
	}
}

// TestHandshakeRefusals: hellos that must not open a link.
func TestHandshakeRefusals(t *testing.T) {
	k, _ := DeriveKeys(testKey)
	other, _ := DeriveKeys(bytes.Repeat([]byte{4}, 32))
	good := Hello{From: 1, To: 2, Hosts: 3, Topology: 1, Round: 2}
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"good", good.encode(k, [16]byte{}), nil},
		{"other key", good.encode(other, [16]byte{}), authframe.ErrBadTag},
		{"no ring edge", Hello{From: 1, To: 0, Hosts: 3}.encode(k, [16]byte{}), authframe.ErrMalformed},
		{"one host", Hello{From: 0, To: 0, Hosts: 1}.encode(k, [16]byte{}), authframe.ErrMalformed},
		{"short", good.encode(k, [16]byte{})[:HelloSize-1], authframe.ErrTruncated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := DecodeHello(k, c.b)
			if !errors.Is(err, c.want) || (c.want == nil && h != good) {
				t.Fatalf("got %+v, %v; want %v", h, err, c.want)
			}
		})
	}
}

func FuzzDecodeHello(f *testing.F) {
	k, _ := DeriveKeys(testKey)
	f.Add(Hello{From: 1, To: 2, Hosts: 3, Topology: 1, Round: 2}.encode(k, [16]byte{5}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHello(k, b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.encode(k, [16]byte(b[56:72])), b) {
			t.Fatalf("accepted %x, re-encodes differently", b)
		}
	})
}

func FuzzCheckHeader(f *testing.F) {
	f.Add(EncodeHeader(3, 100), uint32(3), uint64(100))
	f.Fuzz(func(t *testing.T, b []byte, step uint32, n uint64) {
		if CheckHeader(b, step, n) == nil && !bytes.Equal(b, EncodeHeader(step, n)) {
			t.Fatalf("accepted %x for step %d and %d bytes", b, step, n)
		}
	})
}

// BenchmarkAllReduce: the ring alone, 25 MB of f32 per leader over
// loopback, on links kept across iterations as the averager keeps them
// across a topology's rounds.
func BenchmarkAllReduce(b *testing.B) {
	for _, h := range []int{2, 4} {
		b.Run(fmt.Sprintf("hosts=%d", h), func(b *testing.B) {
			const n = 25e6 / 4
			jobs := make([]Job, h)
			for i := range h {
				jobs[i], _ = f32Job(i, h, make([]float32, n), 1)
			}
			b.SetBytes(4 * n)
			bd := newBed(b, h, 5*time.Second)
			for b.Loop() {
				var wg sync.WaitGroup
				for i := range h {
					wg.Go(func() {
						if _, err := AllReduce(context.Background(), bd.out[i], bd.in[i], jobs[i]); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
		})
	}
}

// BenchmarkLink: one link alone, 25 MB one way over loopback, tagged,
// sent, read and verified: the most one ring step moves per second on
// this CPU (the MAC and the socket copies), whatever the network.
func BenchmarkLink(b *testing.B) {
	bd := newBed(b, 2, 5*time.Second)
	src, dst := make([]byte, 25e6), make([]byte, 25e6)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		sent := make(chan error, 1)
		go func() { sent <- bd.out[0].Send(0, src, nil) }()
		if err := bd.in[1].Receive(0, dst, func(int, int) {}); err != nil {
			b.Fatal(err)
		}
		if err := <-sent; err != nil {
			b.Fatal(err)
		}
	}
}

// TestChunk: frames are about a 32nd of a shard, on 4 KiB, within the
// bounds, and never empty for a non-empty shard.
func TestChunk(t *testing.T) {
	cases := []struct{ n, want int }{
		{0, MinChunk}, {1, MinChunk}, {32 * MinChunk, MinChunk}, {32*MinChunk + 1, MinChunk}, {32 * (MinChunk + 1), MinChunk + 4096},
		{3_125_000, 98304}, {32 * ChunkSize, ChunkSize}, {100 * ChunkSize, ChunkSize},
	}
	for _, c := range cases {
		if got := Chunk(c.n); got != c.want {
			t.Errorf("Chunk(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}
