package trimmedmean

import (
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// The averager honours the plugin contract, checked promise by promise by
// cohort's conformance suite: idle ranks, broadcasts, aborts, sessions
// after a death, shutdown with a round in flight, state across save and
// load, the solo-identity claim. A trimmed mean is not a weighted mean, so
// that one check is off.
func TestConformance(t *testing.T) {
	conformance.RunAverager(t, func(conformance.T) (plugin.Averager, error) { return New(nil), nil },
		conformance.NotWeightedMean())
}
