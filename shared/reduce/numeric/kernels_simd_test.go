//go:build goexperiment.simd && amd64

package numeric

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestVectorKernelsMatchScalar holds the vector kernels to their promise:
// the values they write are the scalar kernels' bit for bit (hosts built
// with and without them must agree), and their sums agree to float32
// rounding.
func TestVectorKernelsMatchScalar(t *testing.T) {
	if Vector == "" {
		t.Skip("this CPU has no AVX2: the scalar kernels run")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64()) * 3
		}
		return x
	}
	same := func(t *testing.T, what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d of %d: %v, scalar %v", what, i, len(want), got[i], want[i])
			}
		}
	}
	near := func(t *testing.T, what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-5*math.Max(1, math.Abs(want)) {
			t.Errorf("%s: %v, scalar %v", what, got, want)
		}
	}
	clone := func(x []float32) []float32 { return append([]float32(nil), x...) }
	for _, n := range []int{0, 1, 7, 8, 9, 255, 256, 257, 512, 1031} {
		x0, x1, v := fill(n), fill(n), fill(n)
		// fused2
		a0, a1, b0, b1 := clone(x0), clone(x1), clone(x0), clone(x1)
		sa, sb := NewStats(2), NewStats(2)
		fused2(a0, a1, 0.3, 1.7, 0.5, &sa)
		fused2Go(b0, b1, 0.3, 1.7, 0.5, &sb)
		same(t, "fused2", a0, b0)
		same(t, "fused2", a1, b1)
		for i := range 2 {
			near(t, "fused2 diff2", sa.Diff2[i], sb.Diff2[i])
			near(t, "fused2 pre2", sa.Pre2[i], sb.Pre2[i])
		}
		near(t, "fused2 post2", sa.Post2, sb.Post2)
		// pair
		a0, a1, b0, b1 = clone(x0), clone(x1), clone(x0), clone(x1)
		d0, d1, p0, p1 := pair(a0, a1, v)
		e0, e1, q0, q1 := pairGo(b0, b1, v)
		same(t, "pair", a0, b0)
		same(t, "pair", a1, b1)
		for _, c := range [][2]float32{{d0, e0}, {d1, e1}, {p0, q0}, {p1, q1}} {
			near(t, "pair sums", float64(c[0]), float64(c[1]))
		}
		// single, overwrite and blend
		for _, al := range []float32{1, 0.25} {
			a0, b0 = clone(x0), clone(x0)
			d0, p0 := single(a0, v, al)
			e0, q0 := singleGo(b0, v, al)
			same(t, "single", a0, b0)
			near(t, "single diff2", float64(d0), float64(e0))
			near(t, "single pre2", float64(p0), float64(q0))
		}
		// weighted sums of 1 to 6 sources
		for m := 1; m <= 6; m++ {
			src := make([][]float32, m)
			w := make([]float32, m)
			for j := range src {
				src[j], w[j] = fill(n), float32(j+1)*0.37
			}
			ws := weighted{src: src, w: w}
			got, want := make([]float32, n), make([]float32, n)
			sumSources(ws, got, 0, n)
			sumGo(ws, want, 0, n)
			same(t, "sum", got, want)
		}
		// scale with squares, squares
		a0, b0 = clone(x0), clone(x0)
		near(t, "scaleSquares", scaleSquares(a0, 0.125), scaleSquaresGo(b0, 0.125))
		same(t, "scaleSquares", a0, b0)
		near(t, "blockSquares", blockSquares(x0), blockSquaresGo(x0))
		// the ring's combine of two, scaled and not
		for _, sc := range []float32{1, 0.25} {
			got, want := make([]float32, n), make([]float32, n)
			combine2(got, x0, x1, sc)
			combine2Go(want, x0, x1, sc)
			same(t, "combine2", got, want)
		}
		// bfloat16: specials and round-to-even ties among the values
		sp := clone(x0)
		for i, f := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0, -0.0,
			math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), math.Float32frombits(0x7f7fffff)} {
			if i < len(sp) {
				sp[i] = f
			}
		}
		h1, h2 := make([]uint16, n), make([]uint16, n)
		encodeBF16(h1, sp)
		encodeBF16Go(h2, sp)
		sameBits16(t, "encodeBF16", h1, h2)
		f1, f2 := make([]float32, n), make([]float32, n)
		decodeBF16(f1, h1)
		decodeBF16Go(f2, h1)
		same(t, "decodeBF16", f1, f2)
		hy := make([]uint16, n)
		encodeBF16Go(hy, x1)
		for _, sc := range []float32{1, 0.25} {
			c1, c2 := make([]uint16, n), make([]uint16, n)
			combine2BF16(c1, h1, hy, sc)
			combine2BF16Go(c2, h1, hy, sc)
			sameBits16(t, "combine2BF16", c1, c2)
		}
		// the SlowMo step
		c1, c2, pr1, pr2, v1, v2 := clone(x0), clone(x0), clone(x1), clone(x1), clone(v), clone(v)
		slowMo(c1, pr1, v1, 0.5, 0.5)
		slowMoGo(c2, pr2, v2, 0.5, 0.5)
		same(t, "slowmo consensus", c1, c2)
		same(t, "slowmo prev", pr1, pr2)
		same(t, "slowmo velocity", v1, v2)
	}
}

// TestVectorApplyMatchesScalar runs whole Applies, whichever paths they
// take (one-pass for two and four ranks, blocked otherwise, idle ranks,
// outer steps, blends), with the vector kernels and with the scalar ones:
// the destinations must match bit for bit.
func TestVectorApplyMatchesScalar(t *testing.T) {
	if Vector == "" {
		t.Skip("this CPU has no AVX2: the scalar kernels run")
	}
	scalar := func(f func()) {
		f2, f4, pr, sg, su := fused2, fused4, pair, single, sumSources
		sc, bs, sm, c2 := scaleSquares, blockSquares, slowMo, combine2
		c16, e16, d16 := combine2BF16, encodeBF16, decodeBF16
		defer func() {
			fused2, fused4, pair, single, sumSources = f2, f4, pr, sg, su
			scaleSquares, blockSquares, slowMo, combine2 = sc, bs, sm, c2
			combine2BF16, encodeBF16, decodeBF16 = c16, e16, d16
		}()
		fused2, fused4, pair, single, sumSources = fused2Go, nil, pairGo, singleGo, sumGo
		scaleSquares, blockSquares, slowMo, combine2 = scaleSquaresGo, blockSquaresGo, slowMoGo, combine2Go
		combine2BF16, encodeBF16, decodeBF16 = combine2BF16Go, encodeBF16Go, decodeBF16Go
		f()
	}
	for _, tc := range []struct {
		name    string
		weights []float64
		outer   Outer
		blend   float32
	}{
		{"2 ranks", []float64{1, 3}, Outer{}, 0},
		{"3 ranks", []float64{1, 2, 3}, Outer{}, 0},
		{"4 ranks", []float64{2, 1, 1, 5}, Outer{}, 0},
		{"4 ranks, one idle", []float64{2, 0, 1, 5}, Outer{}, 0},
		{"5 ranks", []float64{1, 1, 2, 3, 5}, Outer{}, 0},
		{"4 ranks, smoothing", []float64{1, 1, 1, 1}, Outer{Kind: OuterSlowMo, LR: 0.5, Mu: 0.5}, 0},
		{"2 ranks, diloco", []float64{1, 2}, Outer{Kind: OuterDiLoCo, LR: 0.7, Mu: 0.9}, 0},
		{"3 ranks, blend", []float64{1, 2, 1}, Outer{}, 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 4099
			run := func() ([][]float32, Stats) {
				r := rand.New(rand.NewPCG(5, uint64(len(tc.weights))))
				dst := make([][]float32, len(tc.weights))
				for j := range dst {
					dst[j] = make([]float32, n)
					for i := range dst[j] {
						dst[j][i] = float32(r.NormFloat64())
					}
				}
				prev, vel := make([]float32, n), make([]float32, n)
				for i := range prev {
					prev[i], vel[i] = float32(r.NormFloat64()), float32(r.NormFloat64())*0.1
				}
				var sum float64
				for _, w := range tc.weights {
					sum += w
				}
				st := NewStats(len(dst))
				a := Apply{Dst: dst, Weights: tc.weights, Scale: 1 / sum, Outer: tc.outer, Prev: prev, Vel: vel, Blend: tc.blend}
				a.Run(&st)
				return dst, st
			}
			got, gst := run()
			var want [][]float32
			var wst Stats
			scalar(func() { want, wst = run() })
			for j := range want {
				for i := range want[j] {
					if math.Float32bits(got[j][i]) != math.Float32bits(want[j][i]) {
						t.Fatalf("destination %d element %d: %v, scalar %v", j, i, got[j][i], want[j][i])
					}
				}
				if d := math.Abs(gst.Diff2[j] - wst.Diff2[j]); d > 1e-5*math.Max(1, wst.Diff2[j]) {
					t.Errorf("destination %d: Diff2 %v, scalar %v", j, gst.Diff2[j], wst.Diff2[j])
				}
			}
		})
	}
}

func sameBits16(t *testing.T, what string, got, want []uint16) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d of %d: %#04x, scalar %#04x", what, i, len(want), got[i], want[i])
		}
	}
}

// BenchmarkKernels runs each vector kernel beside the scalar one it
// replaces, on 4M elements (16 MB an array, past the caches): a vector
// kernel slower than its scalar twin is a regression (the dirty-upper-half
// stalls kernels_simd.go's VZEROUPPERs prevent made some 12-38× slower).
func BenchmarkKernels(b *testing.B) {
	if Vector == "" {
		b.Skip("this CPU has no AVX2")
	}
	const n = 1 << 22
	mk := func() []float32 {
		y := make([]float32, n)
		for i := range y {
			y[i] = float32(i%977)*1e-3 + 0.5
		}
		return y
	}
	y0, y1, y2, y3, v := mk(), mk(), mk(), mk(), mk()
	u0, u1 := make([]uint16, n), make([]uint16, n)
	encodeBF16Go(u0, y0)
	encodeBF16Go(u1, y1)
	blocks := func(f func(lo, hi int)) {
		for o := 0; o < n; o += blk {
			f(o, min(o+blk, n))
		}
	}
	type k struct {
		name   string
		vec, s func()
	}
	st := NewStats(4)
	ks := []k{
		{"single1", func() { blocks(func(lo, hi int) { singleAVX2(y0[lo:hi], v[lo:hi], 1) }) }, func() { blocks(func(lo, hi int) { singleGo(y0[lo:hi], v[lo:hi], 1) }) }},
		{"single.5", func() { blocks(func(lo, hi int) { singleAVX2(y0[lo:hi], v[lo:hi], .5) }) }, func() { blocks(func(lo, hi int) { singleGo(y0[lo:hi], v[lo:hi], .5) }) }},
		{"pair", func() { blocks(func(lo, hi int) { pairAVX2(y0[lo:hi], y1[lo:hi], v[lo:hi]) }) }, func() { blocks(func(lo, hi int) { pairGo(y0[lo:hi], y1[lo:hi], v[lo:hi]) }) }},
		{"fused2", func() { fused2AVX2(y0, y1, 1, 1, .5, &st) }, func() { fused2Go(y0, y1, 1, 1, .5, &st) }},
		{"fused4", func() { fused4AVX2([4][]float32{y0, y1, y2, y3}, [4]float32{1, 1, 1, 1}, .25, &st) }, func() {
			a := Apply{Dst: [][]float32{y0, y1, y2, y3}, Weights: []float64{1, 1, 1, 1}, Scale: .25}
			f := fused4
			fused4 = nil
			a.Run(&st)
			fused4 = f
		}},
		{"scaleSq", func() { blocks(func(lo, hi int) { scaleSquaresAVX2(v[lo:hi], 1) }) }, func() { blocks(func(lo, hi int) { scaleSquaresGo(v[lo:hi], 1) }) }},
		{"blockSq", func() { blocks(func(lo, hi int) { blockSquaresAVX2(v[lo:hi]) }) }, func() { blocks(func(lo, hi int) { blockSquaresGo(v[lo:hi]) }) }},
		{"slowMo", func() { slowMoAVX2(y0, y1, y2, 0.7, 0.5) }, func() { slowMoGo(y0, y1, y2, 0.7, 0.5) }},
		{"combine2", func() { combine2AVX2(y3, y1, y2, 1) }, func() { combine2Go(y3, y1, y2, 1) }},
		{"decode", func() { decodeBF16AVX2(y3, u0) }, func() { decodeBF16Go(y3, u0) }},
		{"encode", func() { encodeBF16(u1, y2) }, func() { encodeBF16Go(u1, y2) }},
		{"combineBF16", func() { combine2BF16(u1, u0, u1, 1) }, func() { combine2BF16Go(u1, u0, u1, 1) }},
		{"combineBF16.5", func() { combine2BF16(u1, u0, u1, .5) }, func() { combine2BF16Go(u1, u0, u1, .5) }},
	}
	for _, x := range ks {
		b.Run(x.name+"/vector", func(b *testing.B) {
			for b.Loop() {
				x.vec()
			}
		})
		b.Run(x.name+"/scalar", func(b *testing.B) {
			for b.Loop() {
				x.s()
			}
		})
	}
}
