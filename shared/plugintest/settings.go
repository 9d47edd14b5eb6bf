package plugintest

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

// Bounds of the mock trainer. MaxFeatures keeps a model at 32 MiB of f32
// weights (the trainer holds 24 bytes per feature in all); MaxPickSpace
// bounds a plan's permutation at 128 MiB.
const (
	MaxFeatures  = 1 << 23
	MaxSamples   = 1 << 32
	MaxPickSpace = 1 << 24
)

// TrainerSettings is the mock trainer's config block (TrainerConfig.Settings
// as JSON). Zero-valued fields written explicitly are refused; omitted fields
// take the defaults of DefaultTrainerSettings.
type TrainerSettings struct {
	Samples     uint64  `json:"samples"`
	EvalSamples uint64  `json:"eval_samples"`
	Features    int     `json:"features"`
	BatchSize   uint32  `json:"batch_size"`
	LR          float64 `json:"lr" doc:"the learning rate, above 0"`
	// LRDecay makes the learning rate follow the schedule's step t (the
	// cohort's step count a plan names in GlobalStep, counted on from there):
	// lr / (1 + lr_decay·t). 0 keeps it constant.
	LRDecay float64 `json:"lr_decay,omitempty" doc:"the rate at step t is lr / (1 + lr_decay·t), 0 or more"`
	// Momentum is SGD's momentum, in [0, 1): the optimizer keeps a velocity
	// per parameter, state a checkpoint holds and the arena does not.
	Momentum float64 `json:"momentum,omitempty" doc:"SGD momentum in [0, 1)"`
	// Adaptive makes Configure say its optimizer is adaptive
	// (TrainerSetup.AdaptiveOptimizer), as an Adam trainer's does; the
	// mock's own steps stay SGD's.
	Adaptive bool `json:"adaptive,omitempty" doc:"report an adaptive optimizer (the steps stay SGD's)"`
	// ZeroCopy makes the model live in the arena: Attach makes its tensors
	// views of it (zeroCopy true), so training writes the arena in place,
	// as a vendor's zero-copy trainer does. Ignored when the rank runs
	// rounds beside training (OverlapRounds), which needs the parameters
	// out of the arena.
	ZeroCopy bool `json:"zero_copy,omitempty" doc:"train in place in the arena"`
	// SleepPerBatch is a time.Duration string: every batch takes at least
	// this long, to make a slow rank.
	SleepPerBatch string `json:"sleep_per_batch,omitempty" setting:"duration"`
	// SleepPerBatchByRank overrides SleepPerBatch for the ranks it names
	// (keys are decimal ranks): one config file, ranks of unequal speed.
	SleepPerBatchByRank map[string]string `json:"sleep_per_batch_by_rank,omitempty"`
	// Ledger, when set, is a file to which every batch appends the sample
	// indices it trained, one "rank epoch index" line each, in one write.
	Ledger string `json:"ledger,omitempty"`
	// EpochEndFile, when set, is a file to which EpochEnd appends a
	// "rank epoch" line: the mock's end-of-epoch code.
	EpochEndFile string `json:"epoch_end_file,omitempty"`
	// NoiseStdout makes Configure print junk to stdout, through fmt and
	// through a raw write(2) on fd 1, as native libraries do.
	NoiseStdout bool `json:"noise_stdout,omitempty"`
	// FailAfterBatches, when not 0, lets that many batches train in this
	// process; every batch after them fails with an error.
	FailAfterBatches uint64 `json:"fail_after_batches,omitempty"`
	// ExitOnAdopt, when not 0, makes the process exit at that Adopt
	// (counted from 1) of those that come while Train runs, as a trainer
	// killed taking a round beside training would: for tests of the
	// host's recovery. A fresh process counts afresh.
	ExitOnAdopt uint64 `json:"exit_on_adopt,omitempty"`
	// HostCopyBytes is what every Publish reports in
	// PublishResult.HostCopyBytes, as a trainer on a device counts the
	// bytes it copied to and from the host: for tests of the sum a rank
	// reports.
	HostCopyBytes uint64 `json:"host_copy_bytes,omitempty"`
}

// DefaultTrainerSettings are the settings of an empty config block.
func DefaultTrainerSettings() TrainerSettings {
	return TrainerSettings{
		Samples:       2048,
		EvalSamples:   512,
		Features:      16,
		BatchSize:     32,
		LR:            0.1,
		SleepPerBatch: "0",
	}
}

// JSON encodes s for TrainerConfig.Settings.
func (s TrainerSettings) JSON() json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		// Every field is a plain number, string or bool.
		panic(fmt.Sprintf("plugintest: encode trainer settings: %v", err))
	}
	return b
}

// parseTrainerSettings decodes and checks a trainer config block; the
// sleep returned is rank's.
func parseTrainerSettings(raw json.RawMessage, rank uint32) (TrainerSettings, time.Duration, error) {
	s, sleep, problems, err := checkTrainerSettings(raw, rank)
	if err != nil {
		return TrainerSettings{}, 0, err
	}
	if len(problems) > 0 {
		p := problems[0]
		return TrainerSettings{}, 0, fmt.Errorf("mock trainer settings: %s", p.Message)
	}
	return s, sleep, nil
}

// checkTrainerSettings decodes raw and checks every value, returning
// each one refused (Configure refuses the first; CheckSettings lists
// them all) and rank's sleep per batch. err is a block that does not
// decode at all.
func checkTrainerSettings(raw json.RawMessage, rank uint32) (TrainerSettings, time.Duration, []plugin.SettingProblem, error) {
	s := DefaultTrainerSettings()
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return TrainerSettings{}, 0, nil, fmt.Errorf("mock trainer settings: %w", err)
	}
	var problems []plugin.SettingProblem
	bad := func(key, format string, a ...any) {
		problems = append(problems, plugin.SettingProblem{Key: key, Message: key + " " + fmt.Sprintf(format, a...)})
	}
	if s.Samples == 0 || s.Samples > MaxSamples {
		bad("samples", "= %d, want 1..%d", s.Samples, uint64(MaxSamples))
	}
	if s.EvalSamples == 0 || s.EvalSamples > MaxSamples {
		bad("eval_samples", "= %d, want 1..%d", s.EvalSamples, uint64(MaxSamples))
	}
	if s.Features <= 0 || s.Features > MaxFeatures {
		bad("features", "= %d, want 1..%d", s.Features, MaxFeatures)
	}
	if s.BatchSize == 0 {
		bad("batch_size", "= 0, want at least 1")
	}
	if !(s.LR > 0) || math.IsInf(s.LR, 0) {
		bad("lr", "= %v, want a finite number above 0", s.LR)
	}
	if !(s.LRDecay >= 0) || math.IsInf(s.LRDecay, 0) {
		bad("lr_decay", "= %v, want a finite number, 0 or more", s.LRDecay)
	}
	if !(s.Momentum >= 0 && s.Momentum < 1) {
		bad("momentum", "= %v, want a number in [0, 1)", s.Momentum)
	}
	if s.SleepPerBatch == "" {
		s.SleepPerBatch = "0"
	}
	sleep, err := time.ParseDuration(s.SleepPerBatch)
	switch {
	case err != nil:
		bad("sleep_per_batch", "%q: %v", s.SleepPerBatch, err)
	case sleep < 0:
		bad("sleep_per_batch", "= %v, want 0 or more", sleep)
	}
	for _, key := range slices.Sorted(maps.Keys(s.SleepPerBatchByRank)) {
		v := s.SleepPerBatchByRank[key]
		r, err := strconv.ParseUint(key, 10, 32)
		if err != nil {
			bad("sleep_per_batch_by_rank", "key %q is not a rank", key)
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			bad("sleep_per_batch_by_rank", "[%q] = %q, want a duration of 0 or more", key, v)
			continue
		}
		if uint32(r) == rank {
			sleep = d
		}
	}
	return s, sleep, problems, nil
}

// AveragerSettings is the mock averager's config block.
type AveragerSettings struct {
	// Gamma shapes a rank's weight: steps^gamma (0 when it made no steps).
	Gamma float64 `json:"gamma"`
	// LoneRounds makes Configure deny that a lone rank's round is the
	// identity (it is, for this plain mean), so the core runs the rounds of
	// a one-rank cohort instead of skipping them: for testing that path.
	LoneRounds bool `json:"lone_rounds"`
	// SleepPerRound (a Go duration) holds every round that long before it
	// exchanges anything, so a test can land a fault inside a round. An
	// abort or the call's end cuts the wait short.
	SleepPerRound string `json:"sleep_per_round,omitempty" setting:"duration"`
	// HostCopyBytes is what every realized round reports in
	// RoundResult.HostCopyBytes, as an averager staging device parameters
	// through the host would.
	HostCopyBytes uint64 `json:"host_copy_bytes,omitempty"`
}

// DefaultAveragerSettings are the settings of an empty config block.
func DefaultAveragerSettings() AveragerSettings {
	return AveragerSettings{Gamma: 1}
}

// JSON encodes s for AveragerConfig.Settings.
func (s AveragerSettings) JSON() json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("plugintest: encode averager settings: %v", err))
	}
	return b
}

func parseAveragerSettings(raw json.RawMessage) (AveragerSettings, error) {
	s := DefaultAveragerSettings()
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return AveragerSettings{}, fmt.Errorf("mock averager settings: %w", err)
	}
	if !(s.Gamma >= 0) || math.IsInf(s.Gamma, 0) {
		return AveragerSettings{}, fmt.Errorf("mock averager settings: gamma = %v, want a finite number, 0 or more", s.Gamma)
	}
	if _, err := s.roundSleep(); err != nil {
		return AveragerSettings{}, fmt.Errorf("mock averager settings: %w", err)
	}
	return s, nil
}

// roundSleep is SleepPerRound parsed; 0 when unset.
func (s AveragerSettings) roundSleep() (time.Duration, error) {
	if s.SleepPerRound == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s.SleepPerRound)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("sleep_per_round = %q, want a duration of 0 or more", s.SleepPerRound)
	}
	return d, nil
}
