package plugin

import "math/rand/v2"

// Permutation is the epoch's shared order of picks 0..n: every participant
// of a run (coordinator, trainers of every kind) derives the same one from
// (seed, epoch), so a Plan names its samples by offset and size alone.
// A Fisher-Yates shuffle driven by PCG keeps it identical across platforms
// and Go versions.
func Permutation(seed, epoch, n uint64) []uint64 {
	p := make([]uint64, n)
	for i := range p {
		p[i] = uint64(i)
	}
	rng := rand.New(rand.NewPCG(seed, epoch^0x636f686f7274)) // "cohort"
	for i := n; i > 1; i-- {
		j := rng.Uint64N(i)
		p[i-1], p[j] = p[j], p[i-1]
	}
	return p
}

// Picks returns the plan's slice of the permutation, clipped to PickSpace.
func (p Plan) Picks() []uint64 {
	perm := Permutation(p.Seed, p.Epoch, p.PickSpace)
	lo := min(p.PartitionOffset, p.PickSpace)
	hi := lo + min(p.PartitionSize, p.PickSpace-lo)
	return perm[lo:hi]
}
