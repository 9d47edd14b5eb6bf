package conformance

import (
	"math"
	"slices"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The checks of what a plan asks of Train beyond its batches: which
// samples it trains (its picks) and at what learning rate (its LRScale).
// Through the contract the suite cannot see which samples a trainer read
// nor the rate it stepped at, so both are checked by what the trainer
// learns: trainers configured alike, set to the same parameters (the
// suite writes them into the arena and calls Adopt(0), as a broadcast
// round does) and given plans that must train alike or apart. These checks
// need steps that depend on the state, the samples and the rate alone;
// where two trainers given the same plan train apart (randomness the plan
// does not fix), the check says so and checks nothing.

// rankConfig is the suite's configuration for rank of world.
func (s *trainerSuite) rankConfig(rank, world uint32) plugin.TrainerConfig {
	cfg := s.config(s.o.settings)
	cfg.Rank, cfg.WorldSize = rank, world
	return cfg
}

// startAt starts a trainer for cfg and sets its parameters to the suite's
// values drawn from seed: the same starting point for every trainer of a
// check, whatever their own initialization.
func (s *trainerSuite) startAt(t T, cfg plugin.TrainerConfig, seed int) *trainee {
	t.Helper()
	x := s.startWith(t, cfg)
	x.publish()
	x.fillParams(seed)
	if err := x.adoptErr(0); err != nil {
		t.Fatalf("Adopt(0) must succeed after Attach: %v", err)
	}
	return x
}

// trainedBy starts a trainer for cfg at the suite's values, trains p and
// returns what Publish then writes.
func (s *trainerSuite) trainedBy(t T, cfg plugin.TrainerConfig, p plugin.Plan) []byte {
	t.Helper()
	x := s.startAt(t, cfg, 3)
	x.train(p)
	x.publish()
	return slices.Clone(x.arena.Bytes())
}

// samePlan reports whether a third trainer, configured as cfg, trains p
// to the values want: whether the trainer's steps are repeatable, so that
// a difference between two plans' results is theirs.
func (s *trainerSuite) samePlan(t T, cfg plugin.TrainerConfig, p plugin.Plan, want []byte, layout arena.Layout) bool {
	t.Helper()
	if _, _, ok := alike(layout, want, s.trainedBy(t, cfg, p)); ok {
		return true
	}
	t.Logf("two trainers configured alike, set to the same parameters and given the same plan, trained to different values (randomness the plan does not fix): nothing checked")
	return false
}

// onePick is the plan of the one pick at offset of epoch's permutation.
func onePick(epoch, offset, space uint64) plugin.Plan {
	return plugin.Plan{Epoch: epoch, PartitionOffset: offset, PartitionSize: 1, Seed: 7, PickSpace: space}
}

// partition is rank r's share of an epoch of n picks among world ranks,
// as the coordinator splits one: contiguous, the first n%world ranks one
// pick more.
func partition(n uint64, r, world uint32) (offset, size uint64) {
	w, rr := uint64(world), uint64(r)
	size = n / w
	offset = rr*size + min(rr, n%w)
	if rr < n%w {
		size++
	}
	return offset, size
}

// picks holds Train to its plan's picks on every rank of a world of
// TrainerWorld: a plan names its samples by position in the epoch's
// permutation (plugin.Permutation(Seed, Epoch, PickSpace)[PartitionOffset:]
// [:PartitionSize]), whatever the rank. Each rank trains a plan of one
// pick from its own share of epoch 0, sample k; the same sample named by a
// plan of another epoch, at another offset, must train to the same values,
// and the next pick, another sample, to other values.
func (s *trainerSuite) picks(t T) {
	x := s.start(t)
	n, layout := x.setup.Samples, x.setup.Layout
	if n < 3 {
		t.Logf("the data set holds %d samples: nothing to check", n)
		return
	}
	world := s.o.world
	for r := range world {
		off, size := partition(n, r, world)
		if size < 2 {
			t.Logf("rank %d's share of %d samples holds %d: nothing to check", r, n, size)
			continue
		}
		k := plugin.Permutation(7, 0, n)[off]
		a := onePick(0, off, n)
		// The same sample at another offset of a later epoch.
		var b plugin.Plan
		for e := uint64(1); e < 64 && b.PartitionSize == 0; e++ {
			if o := uint64(slices.Index(plugin.Permutation(7, e, n), k)); o != off {
				b = onePick(e, o, n)
			}
		}
		c := onePick(0, off+1, n)
		cfg := s.rankConfig(r, world)
		got := s.trainedBy(t, cfg, a)
		if e, k2, ok := alike(layout, got, s.trainedBy(t, cfg, b)); !ok && s.samePlan(t, cfg, a, got, layout) {
			t.Errorf("Train must train its plan's picks, plugin.Permutation(Seed, Epoch, PickSpace)[PartitionOffset:][:PartitionSize]: rank %d of %d trained sample %d, named by epoch 0 offset %d and by epoch %d offset %d, to different values (%q[%d]; a trainer that reseeds its randomness by epoch trains them apart too)",
				r, world, k, off, b.Epoch, b.PartitionOffset, layout.Entries[e].Name, k2)
			return
		}
		if _, _, ok := alike(layout, got, s.trainedBy(t, cfg, c)); ok {
			t.Errorf("Train must train its plan's picks: rank %d of %d trained epoch 0's picks at offsets %d and %d, samples %d and %d, to the same values",
				r, world, off, off+1, k, plugin.Permutation(7, 0, n)[off+1])
			return
		}
	}
}

// lrScale holds Train to its plan's LRScale: one batch from the same
// parameters with LRScale s moves them s times as far as with none, as
// every optimizer's step is linear in its rate (SGD, momentum, Adam's
// first step, decoupled weight decay).
func (s *trainerSuite) lrScale(t T) {
	const scale = 0.25
	x := s.start(t)
	cfg, layout := s.config(s.o.settings), x.setup.Layout
	p := plugin.Plan{PartitionSize: min(x.setup.Samples, uint64(x.setup.BatchSize)), Seed: 7, PickSpace: x.setup.Samples}
	x.fillParams(3) // the values trainedBy starts from
	from := slices.Clone(x.arena.Bytes())
	full := s.trainedBy(t, cfg, p)
	p.LRScale = scale
	scaled := s.trainedBy(t, cfg, p)

	// The moves without and with the scale, d1 and ds: |ds − s·d1|, and
	// ds's projection on d1 in units of d1 for the message.
	var dFull, dErr, mag, dot float64
	for _, e := range layout.Entries {
		if e.DType != arena.F32 || e.Role != arena.Parameter {
			continue
		}
		for k := 0; k < int(e.Bytes/4); k++ {
			o := e.Offset
			x0 := float64(f32(from[o:], k))
			d1, ds := float64(f32(full[o:], k))-x0, float64(f32(scaled[o:], k))-x0
			dFull += d1 * d1
			dErr += (ds - scale*d1) * (ds - scale*d1)
			dot += d1 * ds
			mag += x0 * x0
		}
	}
	ratio := dot / dFull
	dFull, dErr, mag = math.Sqrt(dFull), math.Sqrt(dErr), math.Sqrt(mag)
	if dFull == 0 {
		t.Errorf("Train must change the parameters: one batch of %d samples left every f32 parameter as it was", p.PartitionSize)
		return
	}
	// f32 rounding of the parameters bounds what the differences can show.
	if dErr > 0.05*scale*dFull+1e-6*mag {
		p.LRScale = 0
		if !s.samePlan(t, cfg, p, full, layout) {
			return
		}
		t.Errorf("Train must multiply its learning rate by the plan's LRScale: one batch with LRScale %v moved the parameters by %.3g·(the move without it) + an error of norm %.3g, want %v times the move (norm %.3g)",
			scale, ratio, dErr, scale, dFull)
	}
}

// alike reports whether a and b hold the same values in every f32 entry,
// within Tolerance of their magnitude, and the same bytes elsewhere; when
// not, the first entry and element that differ.
func alike(layout arena.Layout, a, b []byte) (entry, elem int, ok bool) {
	for i, e := range layout.Entries {
		x, y := a[e.Offset:e.Offset+e.Bytes], b[e.Offset:e.Offset+e.Bytes]
		if e.DType != arena.F32 {
			if k := diffAt(x, y); k >= 0 {
				return i, k, false
			}
			continue
		}
		for k := 0; k < int(e.Bytes/4); k++ {
			u, v := float64(f32(x, k)), float64(f32(y, k))
			if !(math.Abs(u-v) <= Tolerance*math.Max(math.Abs(u)+math.Abs(v), 1e-6)) {
				return i, k, false
			}
		}
	}
	return 0, 0, true
}
