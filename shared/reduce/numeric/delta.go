package numeric

// The bf16 wire's parameters travel as differences from a base every host
// holds identically (the previous round's global parameters): a round's
// change is a small fraction of a parameter's size, and bfloat16's 8-bit
// mantissa keeps that fraction to within 0.4% where it would round the
// parameter itself by up to 0.4% of its whole size, which is often more
// than the round moved it. What each rounding drops is kept in a residual
// the host sends with its next round (error feedback), so nothing the
// cohort learned is lost, only delayed by a round.

// FoldDeltaBF16 writes to dst, in bfloat16, the host's weighted sum of
// differences Σ w[j]·(src[j] − base) plus resid, undivided, and leaves in
// resid what that rounding dropped. Zero weights are skipped. A residual
// that is not finite (a source was) is dropped rather than carried on.
func FoldDeltaBF16(dst []uint16, src [][]float32, w []float64, base, resid []float32) {
	n := len(dst)
	base, resid = base[:n], resid[:n]
	ws := make([]float32, 0, len(w))
	xs := make([][]float32, 0, len(w))
	for j, x := range w {
		if x != 0 {
			ws = append(ws, float32(x))
			xs = append(xs, src[j][:n])
		}
	}
	for i := range dst {
		s := resid[i]
		for j, x := range xs {
			s += ws[j] * (x[i] - base[i])
		}
		q := ToBF16(s)
		dst[i] = q
		resid[i] = finiteOrZero(s - FromBF16(q))
	}
}

// CombineBF16Residual is CombineBF16 of two sources that also adds to
// resid what the rounding dropped, in the sums' own units (before scale):
// (x + y) − decoded(dst)/scale. scale must not be 0.
func CombineBF16Residual(dst, x, y []uint16, scale float32, resid []float32) {
	n := len(dst)
	x, y, resid = x[:n], y[:n], resid[:n]
	inv := 1 / scale
	for i := range dst {
		s := FromBF16(x[i]) + FromBF16(y[i])
		q := ToBF16(s * scale)
		dst[i] = q
		if scale == 1 {
			resid[i] = finiteOrZero(resid[i] + (s - FromBF16(q)))
		} else {
			resid[i] = finiteOrZero(resid[i] + (s - FromBF16(q)*inv))
		}
	}
}

func finiteOrZero(f float32) float32 {
	if f-f != 0 {
		return 0
	}
	return f
}
