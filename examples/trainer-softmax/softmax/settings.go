package softmax

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/cohortdl/cohort/shared/plugin"
)

// Settings are the keys of the config file's trainer "softmax" block.
type Settings struct {
	Data        string  `json:"data" doc:"a directory of MNIST or Fashion-MNIST idx files (.gz); empty: synthetic data from the run's seed"`
	Samples     uint64  `json:"samples" doc:"synthetic data: training rows"`
	EvalSamples uint64  `json:"eval_samples" doc:"synthetic data: evaluation rows"`
	Features    int     `json:"features" doc:"synthetic data: features a row"`
	Classes     int     `json:"classes" doc:"synthetic data: classes, 2 to 256"`
	BatchSize   uint32  `json:"batch_size" doc:"rows a step"`
	LR          float64 `json:"lr" doc:"the learning rate, above 0"`
	LRDecay     float64 `json:"lr_decay" doc:"the rate at step t is lr / (1 + lr_decay·t)"`
	Momentum    float64 `json:"momentum" doc:"SGD momentum in [0, 1)"`
}

// DefaultSettings are the settings of an empty config block.
func DefaultSettings() Settings {
	return Settings{Samples: 4096, EvalSamples: 1024, Features: 32, Classes: 4, BatchSize: 32, LR: 0.1, Momentum: 0.9}
}

// Bounds of the synthetic data: 1 GiB of rows at most.
const (
	maxFeatures = 1 << 16
	maxRowsBy   = 1 << 28 // rows × features
)

// ParseSettings decodes a config block over the defaults and checks it.
func ParseSettings(raw json.RawMessage) (Settings, error) {
	s := DefaultSettings()
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return s, fmt.Errorf("softmax settings: %w", err)
	}
	bad := func(format string, a ...any) (Settings, error) {
		return s, fmt.Errorf("softmax settings: "+format, a...)
	}
	switch {
	case s.BatchSize == 0:
		return bad("batch_size = 0, want at least 1")
	case !(s.LR > 0) || math.IsInf(s.LR, 0):
		return bad("lr = %v, want a finite number above 0", s.LR)
	case !(s.LRDecay >= 0) || math.IsInf(s.LRDecay, 0):
		return bad("lr_decay = %v, want a finite number, 0 or more", s.LRDecay)
	case !(s.Momentum >= 0 && s.Momentum < 1):
		return bad("momentum = %v, want a number in [0, 1)", s.Momentum)
	case s.Data != "":
		return s, nil
	case s.Samples == 0 || s.EvalSamples == 0:
		return bad("samples = %d, eval_samples = %d: want both above 0", s.Samples, s.EvalSamples)
	case s.Features <= 0 || s.Features > maxFeatures:
		return bad("features = %d, want 1..%d", s.Features, maxFeatures)
	case s.Classes < 2 || s.Classes > 256:
		return bad("classes = %d, want 2..256", s.Classes)
	case (s.Samples+s.EvalSamples)*uint64(s.Features) > maxRowsBy:
		return bad("%d rows of %d features is more synthetic data than %d values", s.Samples+s.EvalSamples, s.Features, maxRowsBy)
	}
	return s, nil
}
