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
