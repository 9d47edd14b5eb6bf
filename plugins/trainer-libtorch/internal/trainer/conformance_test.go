package trainer

import (
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// TestConformance runs the conformance suite on the trainer in process,
// with a small MLP on synthetic data.
func TestConformance(t *testing.T) {
	needTorch(t)
	settings := settingsJSON(t, merge(synthData(t, 256, 8, 3), map[string]any{"hidden": []int{16}}))
	conformance.RunTrainer(t, func(conformance.T) (plugin.Trainer, error) { return New(nil) },
		conformance.TrainerSettings(settings))
}
