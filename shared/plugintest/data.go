package plugintest

import (
	"math"
	"math/rand/v2"

	"github.com/cohortdl/cohort/shared/plugin"
)

// Permutation is the epoch's shared order of picks 0..n-1, derived from
// (seed, epoch) alone: plugin.Permutation, the one every participant of a
// run uses, so a plan's slice [offset, offset+size) names the same picks in
// the mock as in the coordinator.
func Permutation(seed, epoch, n uint64) []uint64 {
	return plugin.Permutation(seed, epoch, n)
}

// The data set's splits; each sample is generated from its own PCG stream,
// so no sample depends on another and nothing is held in memory but the
// true weights.
const (
	splitTrain uint64 = 1
	splitEval  uint64 = 2
)

// labelNoise is the standard deviation of the noise added to x·w_true before
// thresholding; x·w_true has unit variance.
const labelNoise = 0.3

// splitmix64 spreads a seed over all 64 bits, so nearby seeds give unrelated
// streams.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// dataset generates the mock's samples on demand from the seed alone.
type dataset struct {
	seed  uint64
	wTrue []float32
	pcg   *rand.PCG
	rng   *rand.Rand
}

func newDataset(seed uint64, features int) *dataset {
	d := &dataset{seed: seed, wTrue: make([]float32, features)}
	d.pcg = rand.NewPCG(splitmix64(seed), 0x77747275) // "wtru"
	d.rng = rand.New(d.pcg)
	scale := 1 / math.Sqrt(float64(features))
	for i := range d.wTrue {
		d.wTrue[i] = float32(d.rng.NormFloat64() * scale)
	}
	return d
}

// sample fills x with the features of sample i of split and returns its
// label (0 or 1). len(x) must be the feature count.
func (d *dataset) sample(split, i uint64, x []float32) float64 {
	d.pcg.Seed(splitmix64(d.seed^split<<56), i)
	var dot float64
	for j := range x {
		v := float32(d.rng.NormFloat64())
		x[j] = v
		dot += float64(v) * float64(d.wTrue[j])
	}
	if dot+labelNoise*d.rng.NormFloat64() > 0 {
		return 1
	}
	return 0
}

// sigmoid is 1/(1+e^-z), computed without overflow.
func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	e := math.Exp(z)
	return e / (1 + e)
}

// bce is the binary cross-entropy of logit z against label y:
// softplus(z) - y·z, stable for large |z|.
func bce(z, y float64) float64 {
	return math.Max(z, 0) + math.Log1p(math.Exp(-math.Abs(z))) - y*z
}
