package plugin

import (
	"fmt"
	"math/rand/v2"
)

// Permutation is the epoch's shared order of picks 0..n: every participant
// of a run (coordinator, trainers of every kind) derives the same one from
// (seed, epoch), so a Plan names its samples by offset and size alone.
// A Fisher-Yates shuffle driven by PCG keeps it identical across platforms
// and Go versions.
func Permutation(seed, epoch, n uint64) []uint64 {
	return permute(make([]uint64, n), seed, epoch)
}

// permute fills p with the permutation of picks 0..len(p) and returns it.
func permute(p []uint64, seed, epoch uint64) []uint64 {
	n := uint64(len(p))
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

// Picker hands a trainer its plans' picks. It keeps the last permutation it
// made, so the many plans of one epoch (chunks, extensions) share one
// shuffle: a permutation of a million picks takes milliseconds, a plan of a
// few batches less. A Picker is not safe for concurrent use.
type Picker struct {
	seed, epoch, n uint64
	perm           []uint64
}

// Picks is p's slice of its epoch's permutation. The slice is the Picker's
// own: read it, do not keep it past the next call. A partition that does
// not fit the pick space is an error.
func (k *Picker) Picks(p Plan) ([]uint64, error) {
	end := p.PartitionOffset + p.PartitionSize
	if end < p.PartitionOffset || end > p.PickSpace {
		return nil, fmt.Errorf("partition [%d, +%d) does not fit a pick space of %d", p.PartitionOffset, p.PartitionSize, p.PickSpace)
	}
	if k.perm == nil || k.seed != p.Seed || k.epoch != p.Epoch || k.n != p.PickSpace {
		k.seed, k.epoch, k.n = p.Seed, p.Epoch, p.PickSpace
		// The last epoch's storage takes the new shuffle: a fresh one (8
		// bytes a pick) every epoch is garbage that a trainer holding its
		// data set on the Go heap keeps for many epochs before collecting.
		if uint64(cap(k.perm)) < p.PickSpace {
			k.perm = make([]uint64, p.PickSpace)
		}
		k.perm = permute(k.perm[:p.PickSpace], p.Seed, p.Epoch)
	}
	return k.perm[p.PartitionOffset:end:end], nil
}
