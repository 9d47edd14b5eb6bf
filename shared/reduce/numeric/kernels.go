package numeric

import (
	"slices"
	"unsafe"
)

// The kernels Apply and the folds run, by element: these scalar ones
// unless kernels_simd.go swaps in vector ones at start-up. Vector is
// "" for these, else the instruction set (averaging-cpu logs it).
var (
	fused2 = fused2Go
	// fused4, when a vector unit has it, is Run's one-pass path for four
	// destinations; the scalar build takes the blocked path.
	fused4       func(x [4][]float32, w [4]float32, inv float32, st *Stats)
	pair         = pairGo
	single       = singleGo
	sumSources   = sumGo
	scaleSquares = scaleSquaresGo
	blockSquares = blockSquaresGo
	slowMo       = slowMoGo
	combine2     = combine2Go
	combine2BF16 = combine2BF16Go
	encodeBF16   = encodeBF16Go
	decodeBF16   = decodeBF16Go
	Vector       = ""
)

// blk is the block the kernels work in: a block of every source stays in
// L1 between a kernel's passes over it.
const blk = 512

// Stats are the divergence sums of an Apply: per destination the sum of
// squared differences between its value before and the value applied, and
// of its squared values before; and once the sum of squared values applied.
// Within a block they accumulate in float32, across blocks in float64.
type Stats struct {
	Diff2, Pre2 []float64
	Post2       float64
}

// NewStats returns zeroed Stats for n destinations.
func NewStats(n int) Stats { return Stats{Diff2: make([]float64, n), Pre2: make([]float64, n)} }

// Add adds o's sums to s's (same number of destinations).
func (s *Stats) Add(o Stats) {
	for i := range s.Diff2 {
		s.Diff2[i] += o.Diff2[i]
		s.Pre2[i] += o.Pre2[i]
	}
	s.Post2 += o.Post2
}

// Apply computes one value per element from a source and writes it into
// every destination, in place, accumulating Stats on the way.
//
// The source is, in order of precedence: ConsF32 or ConsBF16 (a consensus
// already divided), Weights (the weighted mean: Σ Weights[j]·Dst[j] summed
// in float32, zero weights skipped, then multiplied once by Scale, which is
// 1/Σweights), or Dst[Root] (a broadcast).
//
// Each block is done in two passes: the values are formed in a small
// buffer (reading every destination once from memory), then the
// destinations are updated two at a time from L1, which keeps the loops'
// state in registers.
type Apply struct {
	// Dst holds each destination's values before and receives the result;
	// all the same length.
	Dst [][]float32

	ConsF32  []float32
	ConsBF16 []uint16
	// Base, when set, makes ConsBF16 a difference from it: the value is
	// Base + ConsBF16 (the bf16 wire's parameters, numeric/delta.go).
	Base    []float32
	Weights []float64
	Scale   float64
	Root    int

	// Outer, when its Kind is not OuterNone, steps the value with the state
	// Prev and Vel (same length as the destinations) before it is applied.
	Outer     Outer
	Prev, Vel []float32
	Seed      bool

	// Blend in (0, 1) makes each destination pre + Blend·(value − pre) (an
	// EASGD blend); 0 or 1 overwrites. The Stats compare with the value.
	Blend float32
}

// Run applies a over all elements, adding to st (len(a.Dst) destinations).
func (a *Apply) Run(st *Stats) {
	if len(a.Dst) == 0 {
		return
	}
	n := len(a.Dst[0])
	blend := a.Blend > 0 && a.Blend < 1
	mean := a.ConsF32 == nil && a.ConsBF16 == nil && a.Weights != nil
	root := a.Root
	if j, ok := sole(a.Weights); mean && ok {
		// The mean of one contributor is its values, exactly: x·w·(1/w)
		// in float32 is not always x, and a lone rank's round must leave
		// its arena as it was.
		mean, root = false, j
	}
	if mean && len(a.Dst) == 2 && a.Outer.Kind == OuterNone && !blend {
		// Two ranks fit one pass in registers.
		fused2(a.Dst[0], a.Dst[1], float32(a.Weights[0]), float32(a.Weights[1]), float32(a.Scale), st)
		return
	}
	if mean && len(a.Dst) == 4 && a.Outer.Kind == OuterNone && !blend && fused4 != nil && !slices.Contains(a.Weights, 0) {
		var x [4][]float32
		var w [4]float32
		for j := range x {
			x[j], w[j] = a.Dst[j], float32(a.Weights[j])
		}
		fused4(x, w, float32(a.Scale), st)
		return
	}
	var ws weighted
	if mean {
		ws = newWeighted(a.Dst, a.Weights)
	}
	var val [blk]float32
	for b := 0; b < n; b += blk {
		e := min(b+blk, n)
		v := val[:e-b]
		switch {
		case a.ConsF32 != nil:
			copy(v, a.ConsF32[b:e])
		case a.ConsBF16 != nil:
			DecodeBF16(v, a.ConsBF16[b:e])
			if a.Base != nil {
				base := a.Base[b:e]
				base = base[:len(v)]
				for i := range v {
					v[i] += base[i]
				}
			}
		case mean:
			ws.sum(v, b, e)
		default:
			copy(v, a.Dst[root][b:e])
		}
		switch {
		case mean && a.Outer.Kind == OuterNone:
			st.Post2 += scaleSquares(v, float32(a.Scale))
		default:
			if mean {
				scaleSquares(v, float32(a.Scale))
			}
			if a.Outer.Kind != OuterNone {
				a.Outer.Step(v, a.Prev[b:e], a.Vel[b:e], a.Seed)
			}
			st.Post2 += blockSquares(v)
		}
		j := 0
		for ; j+1 < len(a.Dst); j += 2 {
			var d0, d1, p0, p1 float32
			if blend {
				d0, d1, p0, p1 = pairBlend(a.Dst[j][b:e], a.Dst[j+1][b:e], v, a.Blend)
			} else {
				d0, d1, p0, p1 = pair(a.Dst[j][b:e], a.Dst[j+1][b:e], v)
			}
			st.Diff2[j] += float64(d0)
			st.Diff2[j+1] += float64(d1)
			st.Pre2[j] += float64(p0)
			st.Pre2[j+1] += float64(p1)
		}
		if j < len(a.Dst) {
			al := float32(1)
			if blend {
				al = a.Blend
			}
			d0, p0 := single(a.Dst[j][b:e], v, al)
			st.Diff2[j] += float64(d0)
			st.Pre2[j] += float64(p0)
		}
	}
}

// sole reports the index of the only non-zero weight, if exactly one is.
func sole(w []float64) (int, bool) {
	at := -1
	for j, x := range w {
		if x != 0 {
			if at >= 0 {
				return 0, false
			}
			at = j
		}
	}
	return at, at >= 0
}

// fused2 is Run for two destinations and plain weights, in one pass:
// (x0·w0 + x1·w1)·inv, as the weighted path, with the same float32 sums.
// Even and odd elements keep sums of their own, so the adds of one
// element do not wait for the previous one's.
func fused2Go(x0, x1 []float32, w0, w1, inv float32, st *Stats) {
	n := len(x0)
	x1 = x1[:n]
	var D0, D1, P0, P1, Q float64
	for b := 0; b < n; b += fusedBlock {
		e := min(b+fusedBlock, n)
		y0, y1 := x0[b:e], x1[b:e]
		y1 = y1[:len(y0)]
		var d0, d1, p0, p1, q, d0b, d1b, p0b, p1b, qb float32
		i := 0
		for ; i+1 < len(y0); i += 2 {
			a0, a1 := y0[i], y1[i]
			b0, b1 := y0[i+1], y1[i+1]
			s := (a0*w0 + a1*w1) * inv
			t := (b0*w0 + b1*w1) * inv
			e0, e1 := a0-s, a1-s
			f0, f1 := b0-t, b1-t
			d0 += e0 * e0
			d1 += e1 * e1
			p0 += a0 * a0
			p1 += a1 * a1
			q += s * s
			d0b += f0 * f0
			d1b += f1 * f1
			p0b += b0 * b0
			p1b += b1 * b1
			qb += t * t
			y0[i], y1[i], y0[i+1], y1[i+1] = s, s, t, t
		}
		if i < len(y0) {
			a0, a1 := y0[i], y1[i]
			s := (a0*w0 + a1*w1) * inv
			e0, e1 := a0-s, a1-s
			d0 += e0 * e0
			d1 += e1 * e1
			p0 += a0 * a0
			p1 += a1 * a1
			q += s * s
			y0[i], y1[i] = s, s
		}
		D0 += float64(d0) + float64(d0b)
		D1 += float64(d1) + float64(d1b)
		P0 += float64(p0) + float64(p0b)
		P1 += float64(p1) + float64(p1b)
		Q += float64(q) + float64(qb)
	}
	st.Diff2[0] += D0
	st.Diff2[1] += D1
	st.Pre2[0] += P0
	st.Pre2[1] += P1
	st.Post2 += Q
}

// fusedBlock bounds fused2's float32 sums.
const fusedBlock = 256

// pair updates two destinations from v and returns their sums.
func pairGo(y0, y1, v []float32) (d0, d1, p0, p1 float32) {
	y0, y1 = y0[:len(v)], y1[:len(v)]
	for i, s := range v {
		a0, a1 := y0[i], y1[i]
		e0, e1 := a0-s, a1-s
		d0 += e0 * e0
		d1 += e1 * e1
		p0 += a0 * a0
		p1 += a1 * a1
		y0[i], y1[i] = s, s
	}
	return
}

func pairBlend(y0, y1, v []float32, al float32) (d0, d1, p0, p1 float32) {
	y0, y1 = y0[:len(v)], y1[:len(v)]
	for i, s := range v {
		a0, a1 := y0[i], y1[i]
		e0, e1 := a0-s, a1-s
		d0 += e0 * e0
		d1 += e1 * e1
		p0 += a0 * a0
		p1 += a1 * a1
		y0[i], y1[i] = a0-al*e0, a1-al*e1
	}
	return
}

// single updates one destination: y + al·(v − y) (al 1 overwrites). Four
// elements a step, each with sums of its own, so the adds do not wait on
// each other.
func singleGo(y, v []float32, al float32) (d0, p0 float32) {
	y = y[:len(v)]
	var d1, d2, d3, p1, p2, p3 float32
	i := 0
	for ; i+3 < len(v); i += 4 {
		a0, a1, a2, a3 := y[i], y[i+1], y[i+2], y[i+3]
		e0, e1, e2, e3 := a0-v[i], a1-v[i+1], a2-v[i+2], a3-v[i+3]
		d0 += e0 * e0
		d1 += e1 * e1
		d2 += e2 * e2
		d3 += e3 * e3
		p0 += a0 * a0
		p1 += a1 * a1
		p2 += a2 * a2
		p3 += a3 * a3
		if al == 1 {
			y[i], y[i+1], y[i+2], y[i+3] = v[i], v[i+1], v[i+2], v[i+3]
		} else {
			y[i], y[i+1], y[i+2], y[i+3] = a0-al*e0, a1-al*e1, a2-al*e2, a3-al*e3
		}
	}
	for ; i < len(v); i++ {
		a := y[i]
		e := a - v[i]
		d0 += e * e
		p0 += a * a
		y[i] = a - al*e
		if al == 1 {
			y[i] = v[i]
		}
	}
	return (d0 + d1) + (d2 + d3), (p0 + p1) + (p2 + p3)
}

// weighted is a set of sources with their non-zero weights, as float32.
type weighted struct {
	src [][]float32
	w   []float32
}

func newWeighted(src [][]float32, w []float64) weighted {
	var ws weighted
	for j, x := range w {
		if x != 0 {
			ws.src = append(ws.src, src[j])
			ws.w = append(ws.w, float32(x))
		}
	}
	return ws
}

// sum writes Σ w[j]·src[j][b:e] into v, in float32, up to four sources a
// pass.
func (ws weighted) sum(v []float32, b, e int) {
	if len(ws.src) == 0 {
		clear(v)
		return
	}
	sumSources(ws, v, b, e)
}

func sumGo(ws weighted, v []float32, b, e int) {
	for k := 0; k < len(ws.src); k += 4 {
		src, w := ws.src[k:min(k+4, len(ws.src))], ws.w[k:min(k+4, len(ws.src))]
		add := k > 0
		switch len(src) {
		case 1:
			x0 := src[0][b:e]
			x0 = x0[:len(v)]
			w0 := w[0]
			if add {
				for i := range v {
					v[i] += x0[i] * w0
				}
			} else {
				for i := range v {
					v[i] = x0[i] * w0
				}
			}
		case 2:
			x0, x1 := src[0][b:e], src[1][b:e]
			x0, x1 = x0[:len(v)], x1[:len(v)]
			w0, w1 := w[0], w[1]
			if add {
				for i := range v {
					v[i] += x0[i]*w0 + x1[i]*w1
				}
			} else {
				for i := range v {
					v[i] = x0[i]*w0 + x1[i]*w1
				}
			}
		case 3:
			x0, x1, x2 := src[0][b:e], src[1][b:e], src[2][b:e]
			x0, x1, x2 = x0[:len(v)], x1[:len(v)], x2[:len(v)]
			w0, w1, w2 := w[0], w[1], w[2]
			if add {
				for i := range v {
					v[i] += x0[i]*w0 + x1[i]*w1 + x2[i]*w2
				}
			} else {
				for i := range v {
					v[i] = x0[i]*w0 + x1[i]*w1 + x2[i]*w2
				}
			}
		default:
			x0, x1, x2, x3 := src[0][b:e], src[1][b:e], src[2][b:e], src[3][b:e]
			x0, x1, x2, x3 = x0[:len(v)], x1[:len(v)], x2[:len(v)], x3[:len(v)]
			w0, w1, w2, w3 := w[0], w[1], w[2], w[3]
			if add {
				for i := range v {
					v[i] += x0[i]*w0 + x1[i]*w1 + x2[i]*w2 + x3[i]*w3
				}
			} else {
				for i := range v {
					v[i] = x0[i]*w0 + x1[i]*w1 + x2[i]*w2 + x3[i]*w3
				}
			}
		}
	}
}

// scaleSquares multiplies v by scale (the one division) and returns Σ v².
func scaleSquaresGo(v []float32, scale float32) float64 {
	var q0, q1 float32
	i := 0
	for ; i+1 < len(v); i += 2 {
		a, b := v[i]*scale, v[i+1]*scale
		v[i], v[i+1] = a, b
		q0 += a * a
		q1 += b * b
	}
	if i < len(v) {
		a := v[i] * scale
		v[i] = a
		q0 += a * a
	}
	return float64(q0) + float64(q1)
}

// Float32s views b (4-byte aligned, length a multiple of 4) as float32
// values without copying; the platform is little-endian, as the wire.
func Float32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Uint16s views b (2-byte aligned) as uint16 values without copying.
func Uint16s(b []byte) []uint16 {
	if len(b) < 2 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}
