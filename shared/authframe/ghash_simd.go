//go:build goexperiment.simd && amd64

package authframe

import (
	"encoding/binary"
	"simd/archsimd"
)

// GHASH over the payload with VPCLMULQDQ on 512-bit vectors: four blocks
// per carry-less multiply, 32 blocks per reduction. crypto/cipher's GCM
// multiplies one 128-bit block at a time, which held a ring link to about
// 6.5 GB/s of tags on one core; this runs several times faster where the
// CPU has AVX-512 VPCLMULQDQ (Ice Lake and Zen 4 on). The tags are GCM's to
// the bit (gmac_test.go checks them against crypto/cipher), so hosts built
// either way agree.
//
// Field elements are kept byte-reversed, as 128-bit little-endian integers
// (lo, hi): a block's bytes reversed. The product of two such values is
// the reversal of the polynomial product shifted by one bit; multiplying
// by H·x (key.pow holds the powers of H, each times x) instead of by H
// absorbs that shift, and a 256-bit product is reduced modulo GCM's
// polynomial in two folds by its reflected form's top word 0xC2 << 56.

func init() {
	if archsimd.X86.AVX512() && archsimd.X86.AVX512VPCLMULQDQ() {
		newGHash = newWideGHash
	}
}

// wideBlocks is the blocks one reduction covers: 8 vectors of 4.
const wideBlocks = 32

var (
	// gcmPoly is GCM's polynomial, reflected, as the reduction uses it.
	gcmPoly = [2]uint64{1, 0xC2 << 56}
	// reverseBytes reverses each 16-byte lane.
	reverseBytes = func() (r [64]int8) {
		for i := range r {
			r[i] = int8(15 - i%16)
		}
		return r
	}()
)

// wideGHash holds H·x's powers H^32·x … H·x in the order the blocks of a
// 32-block run meet them: pow[2i], pow[2i+1] is the power for block i.
type wideGHash struct {
	pow [2 * wideBlocks]uint64
}

func newWideGHash(h [16]byte) ghasher {
	hx := mulX(elem(h[:]))
	g := &wideGHash{}
	p := hx
	for i := wideBlocks - 1; i >= 0; i-- {
		p.Store((*[2]uint64)(g.pow[2*i : 2*i+2]))
		p = mul(p, hx)
	}
	return g
}

// elem is a 16-byte block as a field element.
func elem(b []byte) archsimd.Uint64x2 {
	return archsimd.LoadUint64x2(&[2]uint64{binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b)})
}

// mulX is a·x: a shifted left by one bit, reduced.
func mulX(a archsimd.Uint64x2) archsimd.Uint64x2 {
	lo, hi := a.GetElem(0), a.GetElem(1)
	top := hi >> 63
	lo, hi = lo<<1, hi<<1|lo>>63
	if top == 1 {
		lo ^= gcmPoly[0]
		hi ^= gcmPoly[1]
	}
	return archsimd.LoadUint64x2(&[2]uint64{lo, hi})
}

// mul is a·b for b one of key's powers (carrying the extra x).
func mul(a, b archsimd.Uint64x2) archsimd.Uint64x2 {
	lo := a.CarrylessMultiply(0, 0, b)
	hi := a.CarrylessMultiply(1, 1, b)
	mid := a.CarrylessMultiply(0, 1, b).Xor(a.CarrylessMultiply(1, 0, b))
	return reduce(lo, hi, mid)
}

// reduce is the field element of the 256-bit product hi·2^128 + mid·2^64 +
// lo.
func reduce(lo, hi, mid archsimd.Uint64x2) archsimd.Uint64x2 {
	var zero archsimd.Uint64x2
	lo = lo.Xor(zero.SelectFromPair(0, 2, mid))
	hi = hi.Xor(mid.SelectFromPair(1, 2, zero))
	poly := archsimd.LoadUint64x2(&gcmPoly)
	for range 2 {
		t := lo.CarrylessMultiply(0, 1, poly)
		lo = lo.SelectFromPair(1, 0, lo).Xor(t)
	}
	return lo.Xor(hi)
}

// sum is GCM's GHASH of data as additional data with no ciphertext: the
// blocks of data, the last zero-padded, then the length block.
func (g *wideGHash) sum(data []byte) [16]byte {
	var y archsimd.Uint64x2
	rev := archsimd.LoadInt8x64(&reverseBytes)
	n := len(data)
	var pw, pk [wideBlocks / 4]archsimd.Uint64x8
	for v := range pw {
		pw[v] = archsimd.LoadUint64x8((*[8]uint64)(g.pow[8*v:]))
		pk[v] = pw[v].Xor(pw[v].SelectFromPairGrouped(1, 0, pw[v]))
	}
	for len(data) >= 16*wideBlocks {
		blk := (*[16 * wideBlocks]byte)(data)
		var lo, hi, mid archsimd.Uint64x8
		for v := range wideBlocks / 4 {
			x := archsimd.LoadUint8x64((*[64]uint8)(blk[64*v:])).PermuteOrZeroGrouped(rev).AsUint64x8()
			if v == 0 {
				var yv archsimd.Uint64x8
				x = x.Xor(yv.SetLo(yv.GetLo().SetLo(y)))
			}
			h := pw[v]
			lo = lo.Xor(x.CarrylessMultiplyGrouped(0, 0, h))
			hi = hi.Xor(x.CarrylessMultiplyGrouped(1, 1, h))
			// Karatsuba: (x.lo^x.hi)(h.lo^h.hi) − lo − hi is the middle term.
			xk := x.Xor(x.SelectFromPairGrouped(1, 0, x))
			mid = mid.Xor(xk.CarrylessMultiplyGrouped(0, 0, pk[v]))
		}
		mid = mid.Xor(lo).Xor(hi)
		y = reduce(fold4(lo), fold4(hi), fold4(mid))
		data = data[16*wideBlocks:]
	}
	// Clean upper halves before the tail's copies: legacy-SSE code after
	// dirty 512-bit state stalls (shared/reduce/numeric's kernels measured
	// 12-38x slower for it).
	archsimd.ClearAVXUpperBits()
	h1 := archsimd.LoadUint64x2Slice(g.pow[2*(wideBlocks-1):])
	for len(data) > 0 {
		var b [16]byte
		copy(b[:], data)
		y = mul(y.Xor(elem(b[:])), h1)
		data = data[min(16, len(data)):]
	}
	var lb [16]byte
	binary.BigEndian.PutUint64(lb[:], uint64(n)*8)
	y = mul(y.Xor(elem(lb[:])), h1)
	var out [16]byte
	binary.BigEndian.PutUint64(out[:], y.GetElem(1))
	binary.BigEndian.PutUint64(out[8:], y.GetElem(0))
	return out
}

// fold4 XORs a vector's four 128-bit lanes.
func fold4(x archsimd.Uint64x8) archsimd.Uint64x2 {
	q := x.GetLo().Xor(x.GetHi())
	return q.GetLo().Xor(q.GetHi())
}
