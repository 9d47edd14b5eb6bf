"""The epoch's shared order of picks, as every cohort participant derives it.

A plan names its samples by offset and size in the permutation of
0..pick_space that (seed, epoch) fixes; Go's plugin.Permutation defines it
(a Fisher-Yates shuffle driven by Go's math/rand/v2 PCG-DXSM and
Rand.Uint64N), and this module reproduces it bit for bit, so a Python
trainer trains exactly the samples a Go trainer would.
"""

_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1
_MUL = (2549297995355413924 << 64) | 4865540595714422341
_INC = (6364136223846793005 << 64) | 1442695040888963407
_CHEAP_MUL = 0xDA942042E4DD58B5
_COHORT = 0x636F686F7274  # "cohort", mixed into the second seed word


class _PCG:
    """Go's rand.PCG: a 128-bit LCG with the DXSM output function."""

    __slots__ = ("state",)

    def __init__(self, seed1, seed2):
        self.state = ((seed1 & _M64) << 64) | (seed2 & _M64)

    def uint64(self):
        s = (self.state * _MUL + _INC) & _M128
        self.state = s
        hi, lo = s >> 64, s & _M64
        hi ^= hi >> 32
        hi = (hi * _CHEAP_MUL) & _M64
        hi ^= hi >> 48
        return (hi * (lo | 1)) & _M64

    def uint64n(self, n):
        """Go's Rand.Uint64N(n) on a 64-bit platform: Lemire's method."""
        if n & (n - 1) == 0:
            return self.uint64() & (n - 1)
        prod = self.uint64() * n
        if prod & _M64 < n:
            thresh = (-n & _M64) % n
            while prod & _M64 < thresh:
                prod = self.uint64() * n
        return prod >> 64


def permutation(seed, epoch, n):
    """The permutation of 0..n-1 that plugin.Permutation(seed, epoch, n) is."""
    p = list(range(n))
    rng = _PCG(seed, (epoch ^ _COHORT) & _M64)
    uint64n = rng.uint64n
    for i in range(n, 1, -1):
        j = uint64n(i)
        p[i - 1], p[j] = p[j], p[i - 1]
    return p


class PlanError(ValueError):
    """A plan that does not fit its pick space."""


class Picker:
    """Hands a trainer its plans' picks, keeping the last permutation it made.

    The many plans of one epoch (chunks, extensions) share one shuffle, as
    Go's plugin.Picker does.
    """

    def __init__(self):
        self._key = None
        self._perm = None

    def picks(self, epoch, seed, pick_space, offset, size):
        end = offset + size
        if end > pick_space:
            raise PlanError(
                "partition [%d, +%d) does not fit a pick space of %d" % (offset, size, pick_space))
        key = (seed, epoch, pick_space)
        if self._key != key:
            self._perm = permutation(seed, epoch, pick_space)
            self._key = key
        return self._perm[offset:end]
