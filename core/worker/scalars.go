package worker

import (
	"math"
	"slices"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// scalarSums sums a plan's trainer scalars per name for its Metrics. What
// a plugin reports is untrusted: a name that is not a valid one is
// dropped, and so are names past plugin.MaxScalars (the plan keeps the
// names it met first; of those new in one batch, the first in byte
// order), so the frame stays small whatever the trainer sends. NaN and
// infinite values are dropped without a word: a diverging model is data,
// not a fault of the plugin.
type scalarSums struct {
	sums map[string]*wirepb.ScalarSum
	// badNames and overLimit count the values dropped for their names;
	// example is one such name, cut to a loggable length.
	badNames, overLimit int
	example             string
}

func (s *scalarSums) add(vals map[string]float64) {
	var fresh []string
	for name, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		if sum := s.sums[name]; sum != nil {
			sum.Sum += v
			sum.Count++
			continue
		}
		switch {
		case !plugin.ValidScalarName(name):
			s.dropped(&s.badNames, name)
		case len(s.sums) == plugin.MaxScalars:
			s.dropped(&s.overLimit, name)
		default:
			fresh = append(fresh, name)
		}
	}
	if room := plugin.MaxScalars - len(s.sums); len(fresh) > room {
		slices.Sort(fresh)
		for _, name := range fresh[room:] {
			s.dropped(&s.overLimit, name)
		}
		fresh = fresh[:room]
	}
	for _, name := range fresh {
		if s.sums == nil {
			s.sums = map[string]*wirepb.ScalarSum{}
		}
		s.sums[name] = &wirepb.ScalarSum{Sum: vals[name], Count: 1}
	}
}

func (s *scalarSums) dropped(count *int, name string) {
	*count++
	if s.example == "" {
		s.example = name[:min(len(name), plugin.MaxScalarName+1)]
	}
}
