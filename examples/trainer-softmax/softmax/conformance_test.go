package softmax

import (
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// The trainer honours the plugin contract, checked promise by promise by
// cohort's conformance suite: batches and reports, every rank's picks,
// LRScale, Publish and Adopt with blends, a checkpoint's next step, a
// replacement that keeps the arena's newer parameters. Settings the config
// must refuse are checked too.
func TestConformance(t *testing.T) {
	conformance.RunTrainer(t, func(conformance.T) (plugin.Trainer, error) { return New(nil), nil },
		conformance.TrainerSettings([]byte(SmallSettings)),
		conformance.BadTrainerSettings([]byte(`{"momentum": 1}`), []byte(`{"classes": 1}`), []byte(`{"data": "/nonexistent"}`)))
}
