package plugin

import (
	"context"
	"encoding/json"

	"github.com/cohortdl/cohort/shared/arena"
)

// Description names a plugin implementation.
type Description struct {
	Name    string
	Version string
	// Capabilities are free-form flags such as "cuda" or "torchscript".
	Capabilities []string
}

// TrainerConfig is what a trainer needs to build its model and data.
type TrainerConfig struct {
	Rank       uint32
	WorldSize  uint32
	LocalRanks uint32
	Seed       uint64
	// Settings is the plugin's own config block as JSON; the core does not
	// interpret it.
	Settings json.RawMessage
}

// TrainerSetup is what Configure learned: the parameter layout (offsets
// packed by arena.Pack) and the data sizes.
type TrainerSetup struct {
	Layout      arena.Layout
	Samples     uint64
	EvalSamples uint64
	BatchSize   uint32
}

// Plan is one contiguous slice of an epoch's shared permutation of
// 0..PickSpace, derived from Seed and Epoch.
type Plan struct {
	Epoch           uint64
	PartitionOffset uint64
	PartitionSize   uint64
	Seed            uint64
	PickSpace       uint64
	// GlobalStep is the cohort's optimizer step count before this plan;
	// learning-rate schedules follow it, not the rank's own count. 0 means
	// no new count since the last plan's: the trainer counts on from that.
	GlobalStep uint64
}

// BatchReport describes one trained batch.
type BatchReport struct {
	// Batch is the batch's index within its plan, from 0.
	Batch     uint64
	Samples   uint32
	Loss      float64
	BatchMS   float64
	DataMS    float64
	StepCount uint64
	// ParamNorm is reported on some batches only.
	ParamNorm *float64
}

// PublishResult is the state of the parameters just written to the arena.
type PublishResult struct {
	// Steps since the previous Publish: this rank's weight in the round.
	Steps     uint64
	StepCount uint64
	ParamNorm float64
}

// EvalResult is one evaluation on the trainer's test split.
type EvalResult struct {
	Loss     float64
	Accuracy *float64
	Samples  uint64
}

// Trainer owns a model, its data partition and its optimizer.
type Trainer interface {
	Describe(ctx context.Context) (Description, error)
	// Configure builds the model and loads data; it returns the layout the
	// arena must have.
	Configure(ctx context.Context, cfg TrainerConfig) (TrainerSetup, error)
	// Attach hands the trainer the arena created for that layout. zeroCopy
	// reports whether the model's tensors now live in it.
	Attach(ctx context.Context, d arena.Descriptor) (zeroCopy bool, err error)
	// Train runs plan, calling report after every batch; a report error
	// stops training and is returned.
	Train(ctx context.Context, plan Plan, report func(BatchReport) error) error
	// Publish makes the arena hold the current parameters.
	Publish(ctx context.Context) (PublishResult, error)
	// Adopt makes the model use the arena's parameters; blendAlpha in (0,1)
	// blends local := (1-a)*local + a*arena (local being the values at the
	// last Publish) instead of overwriting; 0 and 1 overwrite, anything
	// else is an error.
	Adopt(ctx context.Context, blendAlpha float64) (paramNorm float64, err error)
	Evaluate(ctx context.Context) (EvalResult, error)
	SaveCheckpoint(ctx context.Context, dir string) (files []string, err error)
	LoadCheckpoint(ctx context.Context, dir string) (stepCount uint64, err error)
	Shutdown(ctx context.Context) error
}

// AveragerConfig is what an averager needs to join its group.
type AveragerConfig struct {
	Rank      uint32
	WorldSize uint32
	Arena     arena.Descriptor
	// Endpoint is where the backend meets its peers: the reduce server's
	// address, a rendezvous directory, ...
	Endpoint string
	// DataKey authenticates the backend's own data channel; it is derived
	// from the run secret and is never the secret itself.
	DataKey  []byte
	Settings json.RawMessage
	RunID    string
}

// AveragerTraits is what Configure tells the core about the averager's
// rounds under its settings.
type AveragerTraits struct {
	// SoloIdentity: a round whose session has one member leaves the arena
	// bit for bit as it is (a plain weighted mean, no outer optimizer), so
	// the core skips the rounds of a cohort down to one rank. An averager
	// whose lone round still changes something (an outer optimizer's step,
	// say) must leave it false.
	SoloIdentity bool
}

// Round asks for one averaging round.
type Round struct {
	Round uint64
	// Steps since the last round; 0 weighs nothing.
	Steps     uint64
	Broadcast bool
	// Root is the broadcast root's rank in the current session (its
	// Session.NewRank), not its global rank.
	Root uint32
}

// RoundResult describes a finished round.
type RoundResult struct {
	Weight      float64
	TotalWeight float64
	Divergence  float64
	PreNorm     float64
	PostNorm    float64
	BytesMoved  uint64
	ReduceMS    float64
	WaitMS      float64
	TotalMS     float64
	// Realized is false when nobody trained and the arena kept its values.
	Realized bool
}

// Session re-forms the group after a membership change.
type Session struct {
	Generation   uint64
	ID           []byte
	NewRank      uint32
	NewWorldSize uint32
	// Members are global ranks in new-rank order.
	Members []uint32
}

// Averager merges the arena's parameters across ranks, in place.
type Averager interface {
	Describe(ctx context.Context) (Description, error)
	Configure(ctx context.Context, cfg AveragerConfig) (AveragerTraits, error)
	// Average runs one round; it returns when the arena holds the result.
	Average(ctx context.Context, r Round) (RoundResult, error)
	NewSessionID(ctx context.Context) ([]byte, error)
	NewSession(ctx context.Context, s Session) error
	// Abort makes the in-flight round fail promptly. It is idempotent and
	// safe to call concurrently with Average; an aborted averager refuses
	// rounds until the next NewSession.
	Abort(ctx context.Context, reason string) error
	// SaveState writes the averager's own state (an outer optimizer's
	// momentum, say) into dir, beside the trainer's checkpoint, and returns
	// the files written; a stateless averager writes none. LoadState
	// restores it; a directory without the averager's files leaves it fresh.
	SaveState(ctx context.Context, dir string) (files []string, err error)
	LoadState(ctx context.Context, dir string) error
	Shutdown(ctx context.Context) error
}
