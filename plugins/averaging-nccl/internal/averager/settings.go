package averager

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/cohortdl/cohort/internal/cudalib"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Settings is the `averager "nccl"` config block (AveragerConfig.Settings
// as JSON). Unknown keys are errors.
type Settings struct {
	// Gamma weighs a rank's parameters by steps^gamma (default 1).
	Gamma *float64 `json:"gamma"`
	// Device is the GPU this rank's communicator runs on; default the
	// rank modulo the GPUs the process sees.
	Device *int `json:"device"`
	// InitTimeout bounds building a session's communicator, the unique
	// id's exchange included. Default "60s".
	InitTimeout string `json:"init_timeout" setting:"duration"`
	// NCCLLibrary, CUDARuntimeLibrary and CUBLASLibrary point at
	// libnccl.so.2, libcudart.so.* and libcublas.so.* (a file or its
	// directory) ahead of the usual places. cuBLAS is loaded only where
	// ranks share a GPU.
	NCCLLibrary        string `json:"nccl_library"`
	CUDARuntimeLibrary string `json:"cudart_library"`
	CUBLASLibrary      string `json:"cublas_library"`
	// Smoothing, in [0, 1), low-pass filters the consensus across rounds
	// as averaging-cpu's setting of that name does: slow momentum at unit
	// gain (v = s·v + g; new = prev − (1−s)·v, g = prev − consensus) on
	// the parameters, so switching between the two averagers changes
	// where the mean is taken, not what training gets. Rounds with one
	// member are left as they are. Default 0.5; 0 turns it off.
	Smoothing *float64 `json:"smoothing"`
}

// config is Settings validated, with defaults filled in.
type config struct {
	gamma       float64
	device      int // -1: the rank modulo the device count
	initTimeout time.Duration
	libs        cudalib.Options
	smoothing   float64
}

func parseSettings(raw json.RawMessage) (config, error) {
	var s Settings
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return config{}, fmt.Errorf("averager settings: %w", err)
	}
	c := config{gamma: 1, device: -1, initTimeout: 60 * time.Second, smoothing: 0.5,
		libs: cudalib.Options{NCCLPath: s.NCCLLibrary, RuntimePath: s.CUDARuntimeLibrary, BLASPath: s.CUBLASLibrary}}
	if s.Gamma != nil {
		if g := *s.Gamma; math.IsNaN(g) || g < 0 || g > 4 {
			return config{}, fmt.Errorf("averager settings: gamma = %v: want a number in [0, 4]", g)
		}
		c.gamma = *s.Gamma
	}
	if s.Device != nil {
		if *s.Device < 0 {
			return config{}, fmt.Errorf("averager settings: device = %d: want a GPU index from 0", *s.Device)
		}
		c.device = *s.Device
	}
	if s.Smoothing != nil {
		if v := *s.Smoothing; math.IsNaN(v) || v < 0 || v >= 1 {
			return config{}, fmt.Errorf("averager settings: smoothing = %v: want 0 (off) or a value in (0, 1)", v)
		}
		c.smoothing = *s.Smoothing
	}
	if s.InitTimeout != "" {
		d, err := time.ParseDuration(s.InitTimeout)
		if err != nil || d < 10*time.Millisecond || d > time.Hour {
			return config{}, fmt.Errorf("averager settings: init_timeout = %q: want a duration from 10ms to 1h", s.InitTimeout)
		}
		c.initTimeout = d
	}
	return c, nil
}

// weight is a rank's weight for steps: steps^gamma, 0 for none.
func (c config) weight(steps uint64) float64 {
	if steps == 0 {
		return 0
	}
	return math.Pow(float64(steps), c.gamma)
}
