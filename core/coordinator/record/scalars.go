package record

import (
	"slices"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// ScalarSum is a trainer scalar summed over batch reports; a checkpoint
// keeps the epoch in progress's sums, so a resumed epoch's means cover
// all of it.
type ScalarSum struct {
	Sum   float64 `json:"sum"`
	Count uint64  `json:"count"`
}

// epochScalars sums one epoch's trainer scalars (Metrics.scalars) over
// every rank. A peer's figures are checked as a rank checks its trainer's,
// and an epoch keeps at most plugin.MaxScalars names, the first met (of
// those new in one Metrics, the first in byte order): the summary, the
// status page and the metrics' labels stay bounded whatever a rank sends.
type epochScalars struct {
	sums   map[string]ScalarSum
	warned bool // the epoch's one warning about dropped names is out
}

// add sums in into the epoch's scalars and returns how many names it
// dropped; an empty or non-finite sum counts for nothing.
func (e *epochScalars) add(in map[string]ScalarSum) (dropped int) {
	var fresh []string
	for name, s := range in {
		if s.Count == 0 || !finite(s.Sum) {
			continue
		}
		if cur, ok := e.sums[name]; ok {
			e.sums[name] = ScalarSum{Sum: cur.Sum + s.Sum, Count: cur.Count + s.Count}
			continue
		}
		if !plugin.ValidScalarName(name) || len(e.sums) == plugin.MaxScalars {
			dropped++
			continue
		}
		fresh = append(fresh, name)
	}
	if room := plugin.MaxScalars - len(e.sums); len(fresh) > room {
		slices.Sort(fresh)
		dropped += len(fresh) - room
		fresh = fresh[:room]
	}
	for _, name := range fresh {
		if e.sums == nil {
			e.sums = map[string]ScalarSum{}
		}
		e.sums[name] = in[name]
	}
	return dropped
}

// means is each scalar's mean over the epoch's batch reports: what
// summary.json shows; nil for none.
func (e *epochScalars) means() map[string]float64 {
	if len(e.sums) == 0 {
		return nil
	}
	out := make(map[string]float64, len(e.sums))
	for name, s := range e.sums {
		if v := s.Sum / float64(s.Count); finite(v) {
			out[name] = v
		}
	}
	return out
}

// noteScalars adds a plan's Metrics.scalars to the epoch's. A name can
// count at most one value per batch, so a count above the plan's batches
// is refused.
func (r *Recorder) noteScalars(rank uint32, m *wirepb.Metrics) {
	if len(m.GetScalars()) == 0 {
		return
	}
	in := make(map[string]ScalarSum, len(m.GetScalars()))
	refused := 0
	for name, s := range m.GetScalars() {
		if s.GetCount() > m.GetBatches() {
			refused++
			continue
		}
		in[name] = ScalarSum{Sum: s.GetSum(), Count: s.GetCount()}
	}
	sc := &r.agg.scalars
	if n := refused + sc.add(in); n > 0 && !sc.warned {
		sc.warned = true
		r.log.Warn("dropped trainer scalars from a rank's Metrics: invalid names, counts above the plan's batches, or names past the epoch's limit",
			"rank", rank, "epoch", r.agg.epoch, "dropped", n, "limit", plugin.MaxScalars)
	}
}
