package numeric

import (
	"fmt"
	"testing"
)

// BenchmarkApply measures the single-host kernel: a weighted mean of L
// arenas written back into all of them, with divergence sums.
func BenchmarkApply(b *testing.B) {
	const n = 8 << 20
	for _, l := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", l), func(b *testing.B) {
			dst := make([][]float32, l)
			w := make([]float64, l)
			for j := range dst {
				dst[j] = make([]float32, n)
				for i := range dst[j] {
					dst[j][i] = float32(i%977) * 1e-3 * float32(j+1)
				}
				w[j] = float64(j + 1)
			}
			b.SetBytes(int64(n * 4 * l))
			b.ResetTimer()
			for range b.N {
				Parallel(n, 0, func(lo, hi int) {
					d := make([][]float32, l)
					for j := range d {
						d[j] = dst[j][lo:hi]
					}
					st := NewStats(l)
					a := Apply{Dst: d, Weights: w, Scale: 0.1}
					a.Run(&st)
				})
			}
		})
	}
}

// BenchmarkBF16 measures a bf16 wire's kernels on 8M elements: the fold's
// encode, the ring's decode-add-encode of two frames, and the decode.
func BenchmarkBF16(b *testing.B) {
	const n = 8 << 20
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i%977) * 1e-3
	}
	x, y := make([]uint16, n), make([]uint16, n)
	EncodeBF16(x, src)
	EncodeBF16(y, src)
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			EncodeBF16(x, src)
		}
	})
	b.Run("combine2", func(b *testing.B) {
		b.SetBytes(2 * n)
		for b.Loop() {
			CombineBF16(y, [][]uint16{y, x}, 0.5)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(2 * n)
		for b.Loop() {
			DecodeBF16(src, x)
		}
	})
}
