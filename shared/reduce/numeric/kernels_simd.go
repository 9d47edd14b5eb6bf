//go:build goexperiment.simd && amd64

package numeric

import "simd/archsimd"

// The AVX2 kernels, used when the CPU has AVX2 and the package is built
// with GOEXPERIMENT=simd (the Makefile's plugins are). Each does per
// element the scalar kernel's operations in the scalar kernel's order,
// multiplies and adds kept apart (no fused multiply-add), so the values
// they write are the scalar kernels' bit for bit and hosts built either way
// agree; only the float32 divergence sums add up in another order.
//
// Every kernel clears the vector registers' upper halves (VZEROUPPER)
// before it leaves the vector unit for scalar code: the compiler does not,
// and on the CPUs measured (AMD EPYC) each legacy-SSE scalar instruction
// that follows dirty 256-bit state stalls, which made these kernels up to
// 12× slower than the scalar ones they replace (BenchmarkKernels).

func init() {
	if !archsimd.X86.AVX2() {
		return
	}
	fused2 = fused2AVX2
	fused4 = fused4AVX2
	pair = pairAVX2
	single = singleAVX2
	sumSources = sumAVX2
	scaleSquares = scaleSquaresAVX2
	blockSquares = blockSquaresAVX2
	slowMo = slowMoAVX2
	combine2 = combine2AVX2
	decodeBF16 = decodeBF16AVX2
	Vector = "avx2"
	if archsimd.X86.AVX512() {
		// Narrowing 32-bit lanes to 16 (VPMOVDW) is an AVX-512
		// instruction.
		encodeBF16 = encodeBF16AVX512
		combine2BF16 = combine2BF16AVX512
		Vector = "avx2+avx512"
	}
}

// hsum adds a vector's lanes.
func hsum(x archsimd.Float32x8) float32 {
	var a [8]float32
	x.Store(&a)
	archsimd.ClearAVXUpperBits()
	return lanes(&a)
}

func fused2AVX2(x0, x1 []float32, w0, w1, inv float32, st *Stats) {
	n := len(x0)
	x1 = x1[:n]
	var D0, D1, P0, P1, Q float64
	var acc [5][8]float32
	for b := 0; b < n; b += fusedBlock {
		e := min(b+fusedBlock, n)
		y0, y1 := x0[b:e], x1[b:e]
		i := fused2Block(y0, y1[:len(y0)], w0, w1, inv, &acc)
		archsimd.ClearAVXUpperBits()
		D0 += float64(lanes(&acc[0]))
		D1 += float64(lanes(&acc[1]))
		P0 += float64(lanes(&acc[2]))
		P1 += float64(lanes(&acc[3]))
		Q += float64(lanes(&acc[4]))
		if i < len(y0) {
			fused2Go(y0[i:], y1[i:], w0, w1, inv, st)
		}
	}
	st.Diff2[0] += D0
	st.Diff2[1] += D1
	st.Pre2[0] += P0
	st.Pre2[1] += P1
	st.Post2 += Q
}

// fused2Block is fused2's vector pass over one block: it leaves the
// block's per-lane sums in acc (diff², diff², pre², pre², post²) and
// returns how many elements it did. A function of its own so that no
// scalar spill of the caller's float64 sums lands among its vector
// instructions.
//
//go:noinline
func fused2Block(y0, y1 []float32, w0, w1, inv float32, acc *[5][8]float32) int {
	y1 = y1[:len(y0)]
	W0, W1, I := archsimd.BroadcastFloat32x8(w0), archsimd.BroadcastFloat32x8(w1), archsimd.BroadcastFloat32x8(inv)
	var d0, d1, p0, p1, q archsimd.Float32x8
	i := 0
	for ; i+8 <= len(y0); i += 8 {
		a0 := archsimd.LoadFloat32x8Slice(y0[i:])
		a1 := archsimd.LoadFloat32x8Slice(y1[i:])
		s := a0.Mul(W0).Add(a1.Mul(W1)).Mul(I)
		e0, e1 := a0.Sub(s), a1.Sub(s)
		d0 = d0.Add(e0.Mul(e0))
		d1 = d1.Add(e1.Mul(e1))
		p0 = p0.Add(a0.Mul(a0))
		p1 = p1.Add(a1.Mul(a1))
		q = q.Add(s.Mul(s))
		s.StoreSlice(y0[i:])
		s.StoreSlice(y1[i:])
	}
	d0.Store(&acc[0])
	d1.Store(&acc[1])
	p0.Store(&acc[2])
	p1.Store(&acc[3])
	q.Store(&acc[4])
	return i
}

// lanes adds a stored vector's lanes in hsum's order.
func lanes(a *[8]float32) float32 {
	return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

// fused4AVX2 is Run for four destinations and non-zero weights, in one
// pass: (((x0·w0 + x1·w1) + x2·w2) + x3·w3)·inv, the weighted path's sum
// and its one scaling, with that path's divergence sums. Reading each
// arena once, instead of summing into a block and then updating from it,
// is what four ranks on a host need to keep up with memory.
func fused4AVX2(x [4][]float32, w [4]float32, inv float32, st *Stats) {
	n := len(x[0])
	x0, x1, x2, x3 := x[0], x[1][:n], x[2][:n], x[3][:n]
	var D, P [4]float64
	var Q float64
	var acc [9][8]float32
	for b := 0; b < n; b += fusedBlock {
		e := min(b+fusedBlock, n)
		y := [4][]float32{x0[b:e], x1[b:e], x2[b:e], x3[b:e]}
		i := fused4Block(&y, &w, inv, &acc)
		archsimd.ClearAVXUpperBits()
		for j := range D {
			D[j] += float64(lanes(&acc[j]))
			P[j] += float64(lanes(&acc[4+j]))
		}
		Q += float64(lanes(&acc[8]))
		if m := len(y[0]); i < m {
			fused4Tail([4][]float32{y[0][i:], y[1][i:m], y[2][i:m], y[3][i:m]}, w, inv, st)
		}
	}
	for j := range D {
		st.Diff2[j] += D[j]
		st.Pre2[j] += P[j]
	}
	st.Post2 += Q
}

// fused4Block is fused4's vector pass over one block, as fused2Block:
// acc gets diff² of the four, pre² of the four, then post².
//
//go:noinline
func fused4Block(y *[4][]float32, w *[4]float32, inv float32, acc *[9][8]float32) int {
	y0 := y[0]
	m := len(y0)
	y1, y2, y3 := y[1][:m], y[2][:m], y[3][:m]
	W0, W1, W2, W3 := archsimd.BroadcastFloat32x8(w[0]), archsimd.BroadcastFloat32x8(w[1]), archsimd.BroadcastFloat32x8(w[2]), archsimd.BroadcastFloat32x8(w[3])
	I := archsimd.BroadcastFloat32x8(inv)
	var d0, d1, d2, d3, p0, p1, p2, p3, q archsimd.Float32x8
	i := 0
	for ; i+8 <= m; i += 8 {
		a0 := archsimd.LoadFloat32x8Slice(y0[i:])
		a1 := archsimd.LoadFloat32x8Slice(y1[i:])
		a2 := archsimd.LoadFloat32x8Slice(y2[i:])
		a3 := archsimd.LoadFloat32x8Slice(y3[i:])
		s := a0.Mul(W0).Add(a1.Mul(W1)).Add(a2.Mul(W2)).Add(a3.Mul(W3)).Mul(I)
		s.StoreSlice(y0[i:])
		s.StoreSlice(y1[i:])
		s.StoreSlice(y2[i:])
		s.StoreSlice(y3[i:])
		e0, e1, e2, e3 := a0.Sub(s), a1.Sub(s), a2.Sub(s), a3.Sub(s)
		d0, d1, d2, d3 = d0.Add(e0.Mul(e0)), d1.Add(e1.Mul(e1)), d2.Add(e2.Mul(e2)), d3.Add(e3.Mul(e3))
		p0, p1, p2, p3 = p0.Add(a0.Mul(a0)), p1.Add(a1.Mul(a1)), p2.Add(a2.Mul(a2)), p3.Add(a3.Mul(a3))
		q = q.Add(s.Mul(s))
	}
	for j, v := range [...]archsimd.Float32x8{d0, d1, d2, d3, p0, p1, p2, p3, q} {
		v.Store(&acc[j])
	}
	return i
}

// fused4Tail is fused4's scalar form, for the elements short of a vector.
func fused4Tail(y [4][]float32, w [4]float32, inv float32, st *Stats) {
	var sd, sp [4]float32
	var sq float32
	for i := range y[0] {
		a := [4]float32{y[0][i], y[1][i], y[2][i], y[3][i]}
		s := (((a[0]*w[0] + a[1]*w[1]) + a[2]*w[2]) + a[3]*w[3]) * inv
		for j := range a {
			e := a[j] - s
			sd[j] += e * e
			sp[j] += a[j] * a[j]
			y[j][i] = s
		}
		sq += s * s
	}
	for j := range sd {
		st.Diff2[j] += float64(sd[j])
		st.Pre2[j] += float64(sp[j])
	}
	st.Post2 += float64(sq)
}

func pairAVX2(y0, y1, v []float32) (d0, d1, p0, p1 float32) {
	y0, y1 = y0[:len(v)], y1[:len(v)]
	var D0, D1, P0, P1 archsimd.Float32x8
	i := 0
	for ; i+8 <= len(v); i += 8 {
		s := archsimd.LoadFloat32x8Slice(v[i:])
		a0 := archsimd.LoadFloat32x8Slice(y0[i:])
		a1 := archsimd.LoadFloat32x8Slice(y1[i:])
		e0, e1 := a0.Sub(s), a1.Sub(s)
		D0 = D0.Add(e0.Mul(e0))
		D1 = D1.Add(e1.Mul(e1))
		P0 = P0.Add(a0.Mul(a0))
		P1 = P1.Add(a1.Mul(a1))
		s.StoreSlice(y0[i:])
		s.StoreSlice(y1[i:])
	}
	h0, h1, h2, h3 := hsum(D0), hsum(D1), hsum(P0), hsum(P1)
	e0, e1, q0, q1 := pairGo(y0[i:], y1[i:], v[i:])
	return h0 + e0, h1 + e1, h2 + q0, h3 + q1
}

func singleAVX2(y, v []float32, al float32) (d0, p0 float32) {
	y = y[:len(v)]
	AL := archsimd.BroadcastFloat32x8(al)
	var D, P archsimd.Float32x8
	i := 0
	// Two loops rather than a test of al in one: the test is a scalar
	// instruction among vector ones.
	if al == 1 {
		for ; i+8 <= len(v); i += 8 {
			s := archsimd.LoadFloat32x8Slice(v[i:])
			a := archsimd.LoadFloat32x8Slice(y[i:])
			e := a.Sub(s)
			D = D.Add(e.Mul(e))
			P = P.Add(a.Mul(a))
			s.StoreSlice(y[i:])
		}
	} else {
		for ; i+8 <= len(v); i += 8 {
			s := archsimd.LoadFloat32x8Slice(v[i:])
			a := archsimd.LoadFloat32x8Slice(y[i:])
			e := a.Sub(s)
			D = D.Add(e.Mul(e))
			P = P.Add(a.Mul(a))
			a.Sub(AL.Mul(e)).StoreSlice(y[i:])
		}
	}
	d, p := hsum(D), hsum(P)
	e, q := singleGo(y[i:], v[i:], al)
	return d + e, p + q
}

// sumAVX2 is weighted.sum: up to four sources a pass, each pass's terms
// added left to right and then to what earlier passes left.
func sumAVX2(ws weighted, v []float32, b, e int) {
	for k := 0; k < len(ws.src); k += 4 {
		src, w := ws.src[k:min(k+4, len(ws.src))], ws.w[k:min(k+4, len(ws.src))]
		var xs [4][]float32
		var W [4]archsimd.Float32x8
		for j := range src {
			xs[j] = src[j][b:e][:len(v)]
			W[j] = archsimd.BroadcastFloat32x8(w[j])
		}
		add, m := k > 0, len(src)
		i := 0
		for ; i+8 <= len(v); i += 8 {
			t := archsimd.LoadFloat32x8Slice(xs[0][i:]).Mul(W[0])
			for j := 1; j < m; j++ {
				t = t.Add(archsimd.LoadFloat32x8Slice(xs[j][i:]).Mul(W[j]))
			}
			if add {
				t = archsimd.LoadFloat32x8Slice(v[i:]).Add(t)
			}
			t.StoreSlice(v[i:])
		}
		archsimd.ClearAVXUpperBits()
		for ; i < len(v); i++ {
			t := xs[0][i] * w[0]
			for j := 1; j < m; j++ {
				t += xs[j][i] * w[j]
			}
			if add {
				t = v[i] + t
			}
			v[i] = t
		}
	}
}

func scaleSquaresAVX2(v []float32, scale float32) float64 {
	S := archsimd.BroadcastFloat32x8(scale)
	var Q archsimd.Float32x8
	i := 0
	for ; i+8 <= len(v); i += 8 {
		a := archsimd.LoadFloat32x8Slice(v[i:]).Mul(S)
		a.StoreSlice(v[i:])
		Q = Q.Add(a.Mul(a))
	}
	q := hsum(Q)
	for ; i < len(v); i++ {
		a := v[i] * scale
		v[i] = a
		q += a * a
	}
	return float64(q)
}

func blockSquaresAVX2(x []float32) float64 {
	var Q archsimd.Float32x8
	i := 0
	for ; i+8 <= len(x); i += 8 {
		a := archsimd.LoadFloat32x8Slice(x[i:])
		Q = Q.Add(a.Mul(a))
	}
	q := hsum(Q)
	for ; i < len(x); i++ {
		q += x[i] * x[i]
	}
	return float64(q)
}

// slowMoAVX2 is the SlowMo step: v = mu·v + (p − c); new = p − lr·v.
func slowMoAVX2(c, prev, v []float32, lr, mu float32) {
	prev, v = prev[:len(c)], v[:len(c)]
	LR, MU := archsimd.BroadcastFloat32x8(lr), archsimd.BroadcastFloat32x8(mu)
	i := 0
	for ; i+8 <= len(c); i += 8 {
		p := archsimd.LoadFloat32x8Slice(prev[i:])
		ci := archsimd.LoadFloat32x8Slice(c[i:])
		vi := MU.Mul(archsimd.LoadFloat32x8Slice(v[i:])).Add(p.Sub(ci))
		n := p.Sub(LR.Mul(vi))
		vi.StoreSlice(v[i:])
		n.StoreSlice(prev[i:])
		n.StoreSlice(c[i:])
	}
	archsimd.ClearAVXUpperBits()
	slowMoGo(c[i:], prev[i:], v[i:], lr, mu)
}

func combine2AVX2(dst, x, y []float32, scale float32) {
	x, y = x[:len(dst)], y[:len(dst)]
	S := archsimd.BroadcastFloat32x8(scale)
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		archsimd.LoadFloat32x8Slice(x[i:]).Add(archsimd.LoadFloat32x8Slice(y[i:])).Mul(S).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	combine2Go(dst[i:], x[i:], y[i:], scale)
}

func decodeBF16AVX2(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	i := 0
	for ; i+8 <= len(src); i += 8 {
		archsimd.LoadUint16x8Slice(src[i:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8().StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	decodeBF16Go(dst[i:], src[i:])
}

// toBF16x8 is toBF16 on eight floats: round to nearest even, a NaN kept
// quiet, with the scalar form's integer steps.
func toBF16x8(v archsimd.Float32x8) archsimd.Uint16x8 {
	b := v.AsUint32x8()
	hi := b.ShiftAllRight(16)
	r := b.Add(archsimd.BroadcastUint32x8(0x7fff)).Add(hi.And(archsimd.BroadcastUint32x8(1))).ShiftAllRight(16)
	nan := b.And(archsimd.BroadcastUint32x8(0x7fffffff)).Greater(archsimd.BroadcastUint32x8(0x7f800000))
	return hi.Or(archsimd.BroadcastUint32x8(0x0040)).Merge(r, nan).TruncateToUint16()
}

func encodeBF16AVX512(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	i := 0
	for ; i+8 <= len(src); i += 8 {
		toBF16x8(archsimd.LoadFloat32x8Slice(src[i:])).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	encodeBF16Go(dst[i:], src[i:])
}

func combine2BF16AVX512(dst, x, y []uint16, scale float32) {
	x, y = x[:len(dst)], y[:len(dst)]
	S := archsimd.BroadcastFloat32x8(scale)
	widen := func(h []uint16) archsimd.Float32x8 {
		return archsimd.LoadUint16x8Slice(h).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
	}
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		toBF16x8(widen(x[i:]).Add(widen(y[i:])).Mul(S)).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	combine2BF16Go(dst[i:], x[i:], y[i:], scale)
}
