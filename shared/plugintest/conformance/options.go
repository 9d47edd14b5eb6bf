package conformance

import (
	"encoding/json"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
)

// The bounds the suite holds an implementation to.
const (
	// PromptBound is how soon Abort must end a round in flight, and
	// Shutdown return with one in flight.
	PromptBound = 2 * time.Second
	// CallBound is how long any other call may take before the suite gives
	// up on it (a configure that connects, a round of a cohort).
	CallBound = 30 * time.Second
	// Tolerance bounds a weighted mean's error per element, relative to
	// the weighted mean of the magnitudes: |got − want| ≤ Tolerance ·
	// Σ wᵢ|xᵢ| / Σ wᵢ, want computed in float64. f32 sums of a few ranks
	// stay within a few units in the last place (about 1e-7).
	Tolerance = 1e-5
)

// AveragerOption adjusts RunAverager.
type AveragerOption func(*averagerOptions)

type averagerOptions struct {
	world    uint32
	settings json.RawMessage
	gammas   []gammaSettings
	stateful json.RawMessage
	meet     MeetFunc
	notMean  bool
}

type gammaSettings struct {
	gamma    float64
	settings json.RawMessage
}

// World sets the ranks of the suite's cohorts (default 3, at least 2).
func World(n uint32) AveragerOption {
	return func(o *averagerOptions) { o.world = max(n, 2) }
}

// Settings is the averager's config block (AveragerConfig.Settings) for
// every check; its rounds must weigh by steps^1 under it. Default empty.
func Settings(raw json.RawMessage) AveragerOption {
	return func(o *averagerOptions) { o.settings = raw }
}

// Gamma adds settings under which the averager weighs a rank by
// steps^gamma: the weights are checked under them too.
func Gamma(gamma float64, settings json.RawMessage) AveragerOption {
	return func(o *averagerOptions) { o.gammas = append(o.gammas, gammaSettings{gamma, settings}) }
}

// Stateful names settings under which the averager keeps state across
// rounds (an outer optimizer, say): the SaveState/LoadState check runs
// under them too, and so does the SoloIdentity check.
func Stateful(settings json.RawMessage) AveragerOption {
	return func(o *averagerOptions) { o.stateful = settings }
}

// NotWeightedMean says the averager's rounds are not a weighted mean (a
// coordinate-wise median, say): the suite skips comparing them with one,
// and checks every other promise.
func NotWeightedMean() AveragerOption {
	return func(o *averagerOptions) { o.notMean = true }
}

// Meeting is where one cohort of the suite meets, for an averager whose
// Describe says plugin.MeetReduceServer.
type Meeting struct {
	// Endpoint, DataKey and RunID go to every rank's AveragerConfig.
	Endpoint string
	DataKey  []byte
	RunID    string
	// MarkDead tells the meeting point that rank died, as the coordinator
	// does; the suite calls it when it takes a rank out.
	MarkDead func(rank uint32)
}

// MeetFunc makes a fresh meeting point for a cohort of world ranks on
// arenas of layout, ending it at t's cleanup; it fails t when it cannot.
type MeetFunc func(t T, world uint32, layout arena.Layout) Meeting

// MeetingPoint gives the suite the meeting points of an averager that does
// not meet through the relay alone (a reduce server, say: the test starts
// one per cohort). shared/ cannot start the coordinator's servers itself.
func MeetingPoint(f MeetFunc) AveragerOption {
	return func(o *averagerOptions) { o.meet = f }
}

// TrainerOption adjusts RunTrainer.
type TrainerOption func(*trainerOptions)

type trainerOptions struct {
	settings json.RawMessage
	bad      []json.RawMessage
	world    uint32
}

// TrainerWorld sets the ranks of the checks that configure a trainer per
// rank of a world, such as the check of each rank's picks (default 2, at
// least 2).
func TrainerWorld(n uint32) TrainerOption {
	return func(o *trainerOptions) { o.world = max(n, 2) }
}

// TrainerSettings is the trainer's config block (TrainerConfig.Settings);
// it should make a small model and data set, so the checks run fast.
func TrainerSettings(raw json.RawMessage) TrainerOption {
	return func(o *trainerOptions) { o.settings = raw }
}

// BadTrainerSettings adds config blocks Configure must refuse, besides the
// suite's own (an unknown key, and JSON that is not an object).
func BadTrainerSettings(raws ...json.RawMessage) TrainerOption {
	return func(o *trainerOptions) { o.bad = append(o.bad, raws...) }
}
