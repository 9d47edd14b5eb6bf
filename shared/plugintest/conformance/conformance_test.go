package conformance_test

import (
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

func mockAverager(conformance.T) (plugin.Averager, error) { return plugintest.NewAverager(nil), nil }

func mockTrainer(conformance.T) (plugin.Trainer, error) { return plugintest.NewTrainer(nil), nil }

// gamma2 makes the mock averager weigh by steps².
var gamma2 = conformance.Gamma(2, plugintest.AveragerSettings{Gamma: 2}.JSON())

func TestMockAverager(t *testing.T) {
	t.Run("in-process", func(t *testing.T) { conformance.RunAverager(t, mockAverager, gamma2) })
	t.Run("binary", func(t *testing.T) {
		conformance.RunAverager(t, conformance.AveragerBinary(binary(t, "cohort-averaging-mock")), gamma2)
	})
}

// TestMedianAverager runs the suite on an averager written as a vendor
// writes one, from shared/ alone, whose rounds are a median.
func TestMedianAverager(t *testing.T) {
	conformance.RunAverager(t, conformance.AveragerBinary(binary(t, "cohort-averaging-median")), conformance.NotWeightedMean())
}

// smallTrainer keeps the mock trainer's checks fast.
var smallTrainer = conformance.TrainerSettings(plugintest.TrainerSettings{Samples: 256, EvalSamples: 64, Features: 8, BatchSize: 16, LR: 0.1}.JSON())

// inPlaceTrainer is the mock as a zero-copy trainer with optimizer state
// and a schedule: its model trains in the arena, its momentum lives only
// in its checkpoints, and its rate follows the step.
var inPlaceTrainer = conformance.TrainerSettings(plugintest.TrainerSettings{Samples: 256, EvalSamples: 64, Features: 8, BatchSize: 16, LR: 0.1,
	LRDecay: 0.01, Momentum: 0.9, ZeroCopy: true}.JSON())

func TestMockTrainer(t *testing.T) {
	bad := conformance.BadTrainerSettings([]byte(`{"batch_size": 0}`), []byte(`{"momentum": 1}`))
	for _, tc := range []struct {
		name     string
		settings conformance.TrainerOption
	}{
		{"copies", smallTrainer},
		{"in place", inPlaceTrainer},
	} {
		t.Run(tc.name+"/in-process", func(t *testing.T) {
			conformance.RunTrainer(t, mockTrainer, tc.settings, bad, conformance.TrainerWorld(3))
		})
		t.Run(tc.name+"/binary", func(t *testing.T) {
			conformance.RunTrainer(t, conformance.TrainerBinary(binary(t, "cohort-trainer-mock")), tc.settings, bad)
		})
	}
}
