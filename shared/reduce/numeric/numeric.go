// Package numeric is the arithmetic of CPU averaging that a rank's averager
// and the reduce server must agree on: the realized-work weights
// (gamma_mass, mover_mass), the bfloat16 codec, the fused kernels that fold,
// combine and apply parameter blocks, and the outer optimizers (SlowMo,
// DiLoCo).
//
// The law every kernel follows is floDl's: contributions are pre-scaled by
// their weight at the source, summed through any fold, and divided once, by
// the summed weight of exactly the contributions taken, at the end (a
// multiplication by 1/Σweight rounded to float32). Sums are float32, as
// floDl's; divergence sums accumulate in float32 within a block of at most
// 512 elements and in float64 across blocks.
package numeric

import (
	"math"
	"runtime"
	"sync"
)

// GammaMass is a rank's weight for n optimizer steps: 0 when it trained
// nothing (so 0^gamma never counts), n when gamma is 1, n^gamma otherwise.
func GammaMass(n uint64, gamma float64) float64 {
	switch {
	case n == 0:
		return 0
	case gamma == 1:
		return float64(n)
	}
	return math.Pow(float64(n), gamma)
}

// MoverMass is a rank's weight for float buffers: 1 when it trained, else 0.
func MoverMass(n uint64) float64 {
	if n == 0 {
		return 0
	}
	return 1
}

// ToBF16 rounds f to bfloat16, to nearest with ties to even; a NaN stays a
// NaN (quiet), infinities stay infinite.
func ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// FromBF16 widens a bfloat16 to float32 exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// EncodeBF16 writes ToBF16 of every src element to dst (same length). The
// NaN case is a select, not a branch, so the loop has none to mispredict.
func EncodeBF16(dst []uint16, src []float32) { encodeBF16(dst, src) }

func encodeBF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = toBF16(math.Float32bits(f))
	}
}

// toBF16 is ToBF16 on a float's bits, in a form the compiler makes
// branch-free.
func toBF16(b uint32) uint16 {
	r := uint16((b + 0x7fff + (b>>16)&1) >> 16)
	if b&0x7fffffff > 0x7f800000 {
		r = uint16(b>>16) | 0x0040
	}
	return r
}

// DecodeBF16 widens every src element into dst (same length).
func DecodeBF16(dst []float32, src []uint16) { decodeBF16(dst, src) }

func decodeBF16Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// Align is the element granularity of the slices Split hands out: 16
// float32 values, one cache line.
const Align = 16

// Split cuts [0, n) into parts contiguous ranges, each starting on a
// multiple of Align, and returns range i.
func Split(n, parts, i int) (lo, hi int) {
	if parts <= 1 {
		return 0, n
	}
	units := (n + Align - 1) / Align
	lo = units * i / parts * Align
	hi = units * (i + 1) / parts * Align
	return min(lo, n), min(hi, n)
}

// Parallel runs f over Split(n, threads, i) for every i, each on its own
// goroutine, and waits. threads <= 0 means GOMAXPROCS. Ranges too small to
// be worth a goroutine are merged.
func Parallel(n, threads int, f func(lo, hi int)) {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	const minPer = 1 << 15
	threads = max(1, min(threads, (n+minPer-1)/minPer))
	if threads == 1 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		lo, hi := Split(n, threads, i)
		if lo == hi {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}
