package numeric

import "math"

// The folds and combines: a host's ranks summed into one buffer (f32 or
// bf16 on the wire), a broadcast root's copy, the sums of squares behind
// divergence, and the combine of several hosts' partial sums.

// Fold writes the host sum Σ w[j]·src[j] (float32, zero weights skipped)
// into dst, undivided, and adds Σ src[j]² to pre2[j] unless pre2 is nil.
func Fold(dst []float32, src [][]float32, w []float64, pre2 []float64) {
	ws := newWeighted(src, w)
	n := len(dst)
	for b := 0; b < n; b += blk {
		e := min(b+blk, n)
		ws.sum(dst[b:e], b, e)
		addSquares(pre2, src, b, e)
	}
}

// FoldBF16 is Fold with the sum encoded to bfloat16.
func FoldBF16(dst []uint16, src [][]float32, w []float64, pre2 []float64) {
	ws := newWeighted(src, w)
	var v [blk]float32
	n := len(dst)
	for b := 0; b < n; b += blk {
		e := min(b+blk, n)
		ws.sum(v[:e-b], b, e)
		EncodeBF16(dst[b:e], v[:e-b])
		addSquares(pre2, src, b, e)
	}
}

// FoldRoot is the fold of a broadcast: src[root] copied (f32) into dst or
// encoded (bf16) into dst16, whichever is not nil, with pre2 as in Fold.
func FoldRoot(dst []float32, dst16 []uint16, src [][]float32, root int, pre2 []float64) {
	n := len(src[root])
	for b := 0; b < n; b += blk {
		e := min(b+blk, n)
		if dst != nil {
			copy(dst[b:e], src[root][b:e])
		} else {
			EncodeBF16(dst16[b:e], src[root][b:e])
		}
		addSquares(pre2, src, b, e)
	}
}

func addSquares(pre2 []float64, src [][]float32, b, e int) {
	if pre2 == nil {
		return
	}
	for j, s := range src {
		pre2[j] += SumSquares(s[b:e])
	}
}

// blockSquares is Σ x² over at most a block, accumulated in float32 (the
// block is short enough for that to be exact to ~1e-5 relative) and
// returned as float64.
func blockSquaresGo(x []float32) float64 {
	var p0, p1, p2, p3 float32
	i := 0
	for ; i+3 < len(x); i += 4 {
		p0 += x[i] * x[i]
		p1 += x[i+1] * x[i+1]
		p2 += x[i+2] * x[i+2]
		p3 += x[i+3] * x[i+3]
	}
	for ; i < len(x); i++ {
		p0 += x[i] * x[i]
	}
	return float64(p0+p1) + float64(p2+p3)
}

// SumSquares returns Σ x², block sums in float32 added in float64.
func SumSquares(x []float32) float64 {
	var s float64
	for b := 0; b < len(x); b += blk {
		s += blockSquares(x[b:min(b+blk, len(x))])
	}
	return s
}

// Combine writes (Σ src[h]) · scale into dst: the reduce server's sum of
// host folds, accumulated in float32 in host order, then divided once (scale
// is 1/Σweight as float32). No sources writes zeros.
func Combine(dst []float32, src [][]float32, scale float32) {
	if len(src) == 0 {
		clear(dst)
		return
	}
	if len(src) == 2 {
		// The ring's reduce: one pass.
		combine2(dst, src[0], src[1], scale)
		return
	}
	copy(dst, src[0])
	for _, s := range src[1:] {
		s = s[:len(dst)]
		for i := range dst {
			dst[i] += s[i]
		}
	}
	if scale != 1 {
		for i := range dst {
			dst[i] *= scale
		}
	}
}

// combine2Go is Combine of two sources: (x + y)·scale, the sum and the
// scaling Combine's loops do.
func combine2Go(dst, x, y []float32, scale float32) {
	x, y = x[:len(dst)], y[:len(dst)]
	for i := range dst {
		dst[i] = (x[i] + y[i]) * scale
	}
}

// combine2BF16Go is CombineBF16 of two sources.
func combine2BF16Go(dst, x, y []uint16, scale float32) {
	x, y = x[:len(dst)], y[:len(dst)]
	for i := range dst {
		dst[i] = toBF16(math.Float32bits((FromBF16(x[i]) + FromBF16(y[i])) * scale))
	}
}

// CombineBF16 is Combine over bfloat16 frames: each element is decoded,
// summed in float32, scaled, and encoded again.
func CombineBF16(dst []uint16, src [][]uint16, scale float32) {
	if len(src) == 0 {
		clear(dst)
		return
	}
	if len(src) == 2 {
		// The ring's reduce: one pass, no buffer.
		combine2BF16(dst, src[0], src[1], scale)
		return
	}
	var v [blk]float32
	n := len(dst)
	for b := 0; b < n; b += blk {
		e := min(b+blk, n)
		w := v[:e-b]
		DecodeBF16(w, src[0][b:e])
		for _, s := range src[1:] {
			x := s[b:e]
			x = x[:len(w)]
			for i := range w {
				w[i] += FromBF16(x[i])
			}
		}
		if scale != 1 {
			for i := range w {
				w[i] *= scale
			}
		}
		EncodeBF16(dst[b:e], w)
	}
}
