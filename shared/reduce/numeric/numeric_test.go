package numeric

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestGammaMass(t *testing.T) {
	for _, tc := range []struct {
		n     uint64
		gamma float64
		want  float64
	}{
		{0, 1, 0}, {0, 0, 0}, {0, 0.5, 0}, // idle weighs nothing, even 0^0
		{1, 0, 1}, {7, 0, 1},
		{5, 1, 5}, {100, 1, 100},
		{4, 0.5, 2}, {3, 2, 9}, {8, 1.0 / 3, 2},
	} {
		if got := GammaMass(tc.n, tc.gamma); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("GammaMass(%d, %v) = %v, want %v", tc.n, tc.gamma, got, tc.want)
		}
	}
	if MoverMass(0) != 0 || MoverMass(3) != 1 {
		t.Error("MoverMass")
	}
}

func TestBF16(t *testing.T) {
	for _, tc := range []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1.0 exact
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up to even
		{0x3f807fff, 0x3f80}, // below half
		{0x3f808001, 0x3f81}, // above half
		{0x7f7fffff, 0x7f80}, // max float rounds to +Inf
		{0xff800000, 0xff80}, // -Inf
		{0x7f800001, 0x7fc0}, // signalling NaN stays a NaN
		{0xffc00000, 0xffc0}, // quiet NaN
		{0x00000001, 0x0000}, // smallest subnormal rounds to zero
		{0x80000000, 0x8000}, // -0
	} {
		if got := ToBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("ToBF16(%08x) = %04x, want %04x", tc.in, got, tc.want)
		}
		var out [1]uint16
		EncodeBF16(out[:], []float32{math.Float32frombits(tc.in)})
		if out[0] != tc.want {
			t.Errorf("EncodeBF16(%08x) = %04x, want %04x", tc.in, out[0], tc.want)
		}
	}
	// Round trip error is within half a bf16 ulp: at most 2^-8 relative.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		x := float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(20)-10)))
		y := FromBF16(ToBF16(x))
		if math.Abs(float64(y-x)) > math.Abs(float64(x))/256 {
			t.Fatalf("bf16 round trip of %v gave %v", x, y)
		}
	}
}

func randVec(rng *rand.Rand, n int, shift float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() + shift)
	}
	return v
}

// TestApplyWeightedMean: the fused kernel against a float64 reference,
// with zero weights ignored, and its divergence sums.
func TestApplyWeightedMean(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		weights []float64
		// sole is the one contributor, whose values the mean must be bit
		// for bit; -1 when there are several.
		sole int
	}{
		{"equal", 1000, []float64{1, 1, 1, 1}, -1},
		{"steps", 1537, []float64{1, 2, 3, 100}, -1},
		{"idle ranks", 777, []float64{0, 5, 0, 2}, -1},
		{"gamma", 2049, []float64{math.Sqrt(3), math.Sqrt(7)}, -1},
		{"one", 10, []float64{4}, 0},
		{"one of three", 1031, []float64{0, 3, 0}, 1},
		{"three", 999, []float64{1, 0, 2}, -1},
		{"six", 1500, []float64{1, 2, 0, 4, 5, 6}, -1},
		{"nine", 700, []float64{1, 1, 1, 1, 1, 1, 1, 1, 3}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(tc.n)))
			l := len(tc.weights)
			pre := make([][]float32, l)
			dst := make([][]float32, l)
			for j := range pre {
				pre[j] = randVec(rng, tc.n, float64(j))
				dst[j] = append([]float32(nil), pre[j]...)
			}
			var wsum float64
			for _, w := range tc.weights {
				wsum += w
			}
			ref := make([]float64, tc.n)
			for i := range ref {
				for j, w := range tc.weights {
					ref[i] += w * float64(pre[j][i])
				}
				ref[i] /= wsum
			}
			st := NewStats(l)
			a := Apply{Dst: dst, Weights: tc.weights, Scale: 1 / wsum}
			a.Run(&st)
			var d2, r2, q2 float64
			for i := range ref {
				d := float64(dst[0][i]) - ref[i]
				d2 += d * d
				r2 += ref[i] * ref[i]
				q2 += float64(dst[0][i]) * float64(dst[0][i])
			}
			if rel := math.Sqrt(d2 / r2); rel > 1e-6 {
				t.Fatalf("relative error %.3g", rel)
			}
			if tc.sole >= 0 && !slices.Equal(dst[0], pre[tc.sole]) {
				// A lone rank's round is skipped on the strength of this.
				t.Fatalf("the mean of contributor %d alone is not its values bit for bit", tc.sole)
			}
			for j := range dst {
				for i := range ref {
					if dst[j][i] != dst[0][i] {
						t.Fatalf("destination %d differs at %d", j, i)
					}
				}
				var diff, p2 float64
				for i := range ref {
					d := float64(pre[j][i]) - float64(dst[j][i])
					diff += d * d
					p2 += float64(pre[j][i]) * float64(pre[j][i])
				}
				if !near(st.Diff2[j], diff, 1e-5) || !near(st.Pre2[j], p2, 1e-5) {
					t.Fatalf("stats[%d]: %v %v, want %v %v", j, st.Diff2[j], st.Pre2[j], diff, p2)
				}
			}
			if !near(st.Post2, q2, 1e-5) {
				t.Fatalf("post2 %v, want %v", st.Post2, q2)
			}
		})
	}
}

func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Max(math.Abs(b), 1e-30) }

// TestBF16WirePath: fold to bf16 per host, combine on the server, decode
// and apply: the error stays within the bound of two bf16 roundings of the
// weighted magnitudes.
func TestBF16WirePath(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const n = 4096
	hosts := [][][]float32{{randVec(rng, n, 1), randVec(rng, n, 2)}, {randVec(rng, n, -1)}}
	w := [][]float64{{2, 3}, {5}}
	var wsum float64
	folds := make([][]uint16, len(hosts))
	for h, src := range hosts {
		folds[h] = make([]uint16, n)
		FoldBF16(folds[h], src, w[h], nil)
		for _, x := range w[h] {
			wsum += x
		}
	}
	cons := make([]uint16, n)
	CombineBF16(cons, folds, float32(1/wsum))
	for i := 0; i < n; i++ {
		var ref, mag float64
		for h, src := range hosts {
			for j, x := range src {
				ref += w[h][j] * float64(x[i])
				mag += w[h][j] * math.Abs(float64(x[i]))
			}
		}
		ref /= wsum
		mag /= wsum
		got := float64(FromBF16(cons[i]))
		// Rounding each host sum to bf16 (2^-8 of it, at most), an f32 sum,
		// rounding the result (2^-8 of it): bounded by 2^-7 of the weighted
		// magnitude.
		if bound := mag/128 + 1e-30; math.Abs(got-ref) > bound {
			t.Fatalf("element %d: %v, want %v ± %v", i, got, ref, bound)
		}
	}
}

// TestFoldCombineF32 checks the f32 multi-host path matches the reference
// to 1e-6 relative.
func TestFoldCombineF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const n = 3000
	a, b, c := randVec(rng, n, 0), randVec(rng, n, 1), randVec(rng, n, 2)
	f1, f2 := make([]float32, n), make([]float32, n)
	pre := make([]float64, 2)
	Fold(f1, [][]float32{a, b}, []float64{1, 0}, pre)
	Fold(f2, [][]float32{c}, []float64{3}, nil)
	if !near(pre[0], SumSquares(a), 1e-9) || !near(pre[1], SumSquares(b), 1e-9) {
		t.Fatal("fold's pre sums")
	}
	out := make([]float32, n)
	Combine(out, [][]float32{f1, f2}, float32(1.0/4))
	var d2, r2 float64
	for i := range out {
		ref := (float64(a[i]) + 3*float64(c[i])) / 4
		d2 += (float64(out[i]) - ref) * (float64(out[i]) - ref)
		r2 += ref * ref
	}
	if rel := math.Sqrt(d2 / r2); rel > 1e-6 {
		t.Fatalf("relative error %.3g", rel)
	}
}

// TestOuterStep checks SlowMo and DiLoCo against hand-computed values.
func TestOuterStep(t *testing.T) {
	// prev = 1.0, consensus = 0.5 → g = 0.5; v starts at 0.2.
	for _, tc := range []struct {
		name    string
		o       Outer
		newVal  float32
		newVel  float32
		seed    bool
		consIn  float32
		prevIn  float32
		velIn   float32
		newPrev float32
	}{
		// v = 0.9*0.2 + 0.5 = 0.68; new = 1 - 1.0*0.68 = 0.32
		{"slowmo", Outer{OuterSlowMo, 1.0, 0.9}, 0.32, 0.68, false, 0.5, 1, 0.2, 0.32},
		// v = 0.68; new = 1 - 0.7*(0.9*0.68 + 0.5) = 1 - 0.7*1.112 = 0.2216
		{"diloco", Outer{OuterDiLoCo, 0.7, 0.9}, 0.2216, 0.68, false, 0.5, 1, 0.2, 0.2216},
		// lr 0.5, mu 0: v = g = 0.5; slowmo new = 1 - 0.25 = 0.75
		{"slowmo-nomomentum", Outer{OuterSlowMo, 0.5, 0}, 0.75, 0.5, false, 0.5, 1, 0.2, 0.75},
		// seed: prev = consensus, v = 0, value unchanged.
		{"seed", Outer{OuterDiLoCo, 0.7, 0.9}, 0.5, 0, true, 0.5, 1, 0.2, 0.5},
		// none leaves everything.
		{"none", Outer{}, 0.5, 0.2, false, 0.5, 1, 0.2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, p, v := []float32{tc.consIn}, []float32{tc.prevIn}, []float32{tc.velIn}
			tc.o.Step(c, p, v, tc.seed)
			if math.Abs(float64(c[0]-tc.newVal)) > 1e-6 || math.Abs(float64(v[0]-tc.newVel)) > 1e-6 || math.Abs(float64(p[0]-tc.newPrev)) > 1e-6 {
				t.Fatalf("got value %v vel %v prev %v; want %v %v %v", c[0], v[0], p[0], tc.newVal, tc.newVel, tc.newPrev)
			}
		})
	}
	// Two DiLoCo windows by hand: prev 0, consensus 1 then 3 (lr 1, mu 0.5).
	o := Outer{OuterDiLoCo, 1, 0.5}
	p, v := []float32{0}, []float32{0}
	c := []float32{1}
	o.Step(c, p, v, true) // seed: prev = 1
	c = []float32{3}
	o.Step(c, p, v, false) // g = -2; v = -2; new = 1 - (0.5*-2 + -2) = 4
	if c[0] != 4 || p[0] != 4 || v[0] != -2 {
		t.Fatalf("second window: %v %v %v", c[0], p[0], v[0])
	}
}

func TestApplyBroadcastAndBlend(t *testing.T) {
	a := []float32{1, 2, 3}
	b := []float32{5, 6, 7}
	st := NewStats(2)
	(&Apply{Dst: [][]float32{a, b}, Root: 1}).Run(&st)
	if a[2] != 7 || b[0] != 5 || st.Diff2[1] != 0 || st.Diff2[0] != 48 {
		t.Fatalf("broadcast: %v %v %+v", a, b, st)
	}
	x := []float32{0, 10}
	(&Apply{Dst: [][]float32{x}, ConsF32: []float32{4, 2}, Blend: 0.25}).Run(&st)
	if x[0] != 1 || x[1] != 8 {
		t.Fatalf("blend: %v", x)
	}
}

func TestSplit(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 17, 1000, 123457} {
		for parts := 1; parts <= 7; parts++ {
			prev := 0
			for i := 0; i < parts; i++ {
				lo, hi := Split(n, parts, i)
				if lo != prev || hi < lo || (lo%Align != 0 && lo != n) {
					t.Fatalf("Split(%d,%d,%d) = %d,%d after %d", n, parts, i, lo, hi, prev)
				}
				prev = hi
			}
			if prev != n {
				t.Fatalf("Split(%d,%d) covers %d", n, parts, prev)
			}
		}
	}
}

// TestBF16KernelsMatchScalar: the bulk encode and the ring's two-frame
// combine give exactly what ToBF16 and FromBF16 give one element at a
// time, on ties, subnormals, infinities and NaNs, with and without a
// scale.
func TestBF16KernelsMatchScalar(t *testing.T) {
	vals := []float32{0, 1, -1, 1.00390625, 1.01171875, 3.4e38, -3.4e38, 1e-40, float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00001), math.Float32frombits(0xff800001), 0.1, -2.5e-3}
	n := len(vals) * len(vals)
	src := make([]float32, n)
	x, y := make([]uint16, n), make([]uint16, n)
	for i := range n {
		src[i] = vals[i%len(vals)]
		x[i], y[i] = ToBF16(vals[i%len(vals)]), ToBF16(vals[i/len(vals)])
	}
	enc := make([]uint16, n)
	EncodeBF16(enc, src)
	for i, f := range src {
		if want := ToBF16(f); enc[i] != want {
			t.Fatalf("EncodeBF16(%v) = %#04x, want %#04x", f, enc[i], want)
		}
	}
	for _, scale := range []float32{1, 0.25} {
		dst := make([]uint16, n)
		CombineBF16(dst, [][]uint16{x, y}, scale)
		for i := range dst {
			want := ToBF16((FromBF16(x[i]) + FromBF16(y[i])) * scale)
			if dst[i] != want && !(math.IsNaN(float64(FromBF16(dst[i]))) && math.IsNaN(float64(FromBF16(want)))) {
				t.Fatalf("scale %v: %#04x + %#04x = %#04x, want %#04x", scale, x[i], y[i], dst[i], want)
			}
		}
	}
}
