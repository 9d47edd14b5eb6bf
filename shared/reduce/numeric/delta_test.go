package numeric

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Error feedback loses nothing: what a fold or a combine sends plus what
// it leaves in the residual is exactly what it had to send, so a residual
// carried to the next round delivers the rest.
func TestDeltaResidualConserves(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 300
	base := make([]float32, n)
	src := [][]float32{make([]float32, n), make([]float32, n), make([]float32, n)}
	for i := range base {
		base[i] = float32(rng.NormFloat64())
		for _, s := range src {
			s[i] = base[i] + float32(1e-3*rng.NormFloat64())
		}
	}
	src[1][7] = float32(math.Inf(1)) // its residual must not go on as NaN
	cases := []struct {
		name string
		w    []float64
	}{
		{"equal", []float64{1, 1, 1}},
		{"weighted, one idle", []float64{3, 0, 5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resid := make([]float32, n)
			for i := range resid {
				resid[i] = float32(1e-4 * rng.NormFloat64())
			}
			before := append([]float32(nil), resid...)
			dst := make([]uint16, n)
			FoldDeltaBF16(dst, src, tc.w, base, resid)
			for i := range dst {
				want := before[i]
				for j, s := range src {
					if tc.w[j] != 0 {
						want += float32(tc.w[j]) * (s[i] - base[i])
					}
				}
				if math.IsInf(float64(want), 0) {
					if resid[i] != 0 {
						t.Fatalf("element %d: residual %v after an infinite sum", i, resid[i])
					}
					continue
				}
				if got := FromBF16(dst[i]) + resid[i]; got != want {
					t.Fatalf("element %d: sent %v + residual %v = %v, want %v", i, FromBF16(dst[i]), resid[i], got, want)
				}
			}
			// A combine's scaled rounding goes back in sum units.
			other := make([]uint16, n)
			EncodeBF16(other, src[2])
			r2 := make([]float32, n)
			out := make([]uint16, n)
			const scale = 0.125
			CombineBF16Residual(out, dst, other, scale, r2)
			for i := range out {
				s := FromBF16(dst[i]) + FromBF16(other[i])
				if math.IsInf(float64(s), 0) {
					continue
				}
				if got := float64(FromBF16(out[i]))/scale + float64(r2[i]); math.Abs(got-float64(s)) > 1e-6*math.Abs(float64(s)) {
					t.Fatalf("element %d: combined %v/scale + residual %v = %v, want %v", i, FromBF16(out[i]), r2[i], got, s)
				}
			}
		})
	}
}

// Apply with a Base adds the decoded consensus to it.
func TestApplyBase(t *testing.T) {
	base := []float32{1, -2, 3.5}
	cons := make([]uint16, 3)
	EncodeBF16(cons, []float32{0.25, -0.5, 0})
	dst := [][]float32{{9, 9, 9}}
	st := NewStats(1)
	a := Apply{Dst: dst, ConsBF16: cons, Base: base}
	a.Run(&st)
	for i, want := range []float32{1.25, -2.5, 3.5} {
		if dst[0][i] != want {
			t.Fatalf("element %d = %v, want %v", i, dst[0][i], want)
		}
	}
}
