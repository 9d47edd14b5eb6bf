package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/mtls"
)

// Description names a plugin implementation.
type Description struct {
	Name    string
	Version string
	// Capabilities are free-form flags such as "cuda" or "torchscript".
	Capabilities []string
	// Meeting is an averager's meeting kind: how its ranks find each other
	// (MeetRelay, the default when empty, or MeetReduceServer). The core
	// asks the coordinator for a meeting point of this kind and hands its
	// endpoint to Configure. Trainers leave it empty.
	Meeting string
	// Settings is the schema of the plugin's config block, which the core
	// checks before any rank starts (SchemaOf derives it from a settings
	// struct). Nil declares none, and the block is not checked; an empty,
	// non-nil schema declares that the plugin takes no settings.
	Settings []SettingSpec
}

// SettingsChecker is an optional Trainer and Averager method.
// CheckSettings checks a config block's settings (the JSON Configure's
// settings would carry) as Configure would read them, without loading
// data, starting a backend or training, and returns every value it
// refuses: `cohort validate` and `cohort run` report them with the file
// and line of each key before any rank starts. A plugin without it is
// checked against its declared schema alone; the host asks its plugins
// for it over the protocol, and one built before the method existed
// answers that it has none.
type SettingsChecker interface {
	CheckSettings(ctx context.Context, settings json.RawMessage) ([]SettingProblem, error)
}

// SettingProblem is one value CheckSettings refuses.
type SettingProblem struct {
	// Key is the block's key at fault ("lr"); "" for the block as a whole.
	Key     string
	Message string
}

// EpochEnder is an optional Trainer method. EpochEnd runs the user's
// end-of-epoch code (trainer-libtorch: a TorchScript model's epoch_end
// method) on the rank the coordinator elected for callbacks, after the
// epoch's last round and its evaluation; ran reports whether the trainer
// had any. Its time is not batch time.
type EpochEnder interface {
	EpochEnd(ctx context.Context, epoch uint64) (ran bool, err error)
}

// GroupedTrainer is an optional Trainer method, the host's side of
// Plan.ReportMerge: TrainGrouped is Train with report called once per
// group of reports as they arrive together (a plugin's merged message), in
// training order, so the host forwards a group at once instead of holding
// it for an interval of its own.
type GroupedTrainer interface {
	TrainGrouped(ctx context.Context, plan Plan, report func([]BatchReport) error) error
}

// CapDeviceBlock is the capability a plugin declares in
// Description.Capabilities when it handles an arena.DeviceBlock: a
// trainer that implements DeviceExporter, or an averager that averages the
// block of AveragerConfig.Arena.Device in place of the arena's f32
// entries. The core asks for a block only when both plugins declare it.
const CapDeviceBlock = "device-block"

// DeviceExporter is an optional Trainer method. ExportDevice, called once
// after Attach, makes the trainer keep its f32 parameters and buffers in a
// GPU block from then on (Publish leaves it current, Adopt takes it as the
// arena's values; the arena's copies of those entries go stale) and
// describes the block; ok false leaves the trainer on the arena (its model
// is on the CPU, or it keeps its parameters apart for rounds beside
// training). The block lives as long as the trainer process.
type DeviceExporter interface {
	ExportDevice(ctx context.Context) (b arena.DeviceBlock, ok bool, err error)
}

// CapTrainsDuringRounds is the capability a trainer declares in
// Description.Capabilities when it can train while a round runs: with
// TrainerConfig.OverlapRounds it keeps its parameters out of the arena,
// Publish and Adopt may be called while Train runs (between its steps),
// and Adopt credits the steps trained since Publish.
const CapTrainsDuringRounds = "trains-during-rounds"

// The meeting kinds an averager can declare in Description.Meeting.
const (
	// MeetRelay: the ranks meet through AveragerConfig.Relay alone, which
	// works wherever the control protocol reaches (across hosts too);
	// AveragerConfig.Endpoint is empty.
	MeetRelay = "relay"
	// MeetReduceServer: the ranks meet at the coordinator's reduce server
	// and speak shared/reduce to it; AveragerConfig.Endpoint is its
	// address.
	MeetReduceServer = "reduce-server"
)

// MeetingKind is d's meeting kind, MeetRelay when d declares none.
func (d Description) MeetingKind() string {
	if d.Meeting == "" {
		return MeetRelay
	}
	return d.Meeting
}

// TrainerConfig is what a trainer needs to build its model and data.
type TrainerConfig struct {
	Rank       uint32
	WorldSize  uint32
	LocalRanks uint32
	Seed       uint64
	// OverlapRounds is set, for a trainer that declared
	// CapTrainsDuringRounds, when the cohort runs averaging rounds while
	// its ranks train (the async policy): the trainer keeps its parameters
	// out of the arena (Attach returns zeroCopy false), so the averager can
	// work on the arena while Train goes on.
	OverlapRounds bool
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
	// AdaptiveOptimizer says the optimizer scales each element's step by
	// that element's own gradient history (Adam, AdamW, RMSprop, Adagrad,
	// …). Each rank's such steps drift apart between rounds further than
	// SGD's do for the same distance from the average, so where the config
	// sets no divergence_target the coordinator aims five times tighter
	// (averaging-cpu's README has the measurements).
	AdaptiveOptimizer bool
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
	// LRScale multiplies the trainer's own learning rate (its schedule's
	// rate at each step) for this plan's batches: the coordinator lowers it
	// on a plateau or a divergence spike. Every rank's plans after one
	// round carry the same scale, so the cohort changes rate at one step.
	// 0 means 1.
	LRScale float64
	// ReportMerge, when not 0, lets a plugin process hold the plan's batch
	// reports and send them together, a message at most every ReportMerge
	// (protocol 4 on). Serve's adapter does the holding; a Trainer need
	// not read it. The host sets it only for a plan whose reports no round
	// waits on (a cohort of one rank): there a message per batch of a few
	// milliseconds costs the host's CPU more than the step it reports.
	ReportMerge time.Duration
}

// LRMultiplier is p's learning-rate scale as a trainer applies it: 1 when
// none is set (0), an error for one that is not a finite number above 0.
func (p Plan) LRMultiplier() (float64, error) {
	switch s := p.LRScale; {
	case s == 0:
		return 1, nil
	case s > 0 && !math.IsInf(s, 1):
		return s, nil
	}
	return 0, fmt.Errorf("learning-rate scale %v, want a finite number above 0", p.LRScale)
}

// Milliseconds is d as the float64 milliseconds that BatchReport and
// RoundResult carry their times in (and the core's own reports too).
func Milliseconds(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

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
	// Scalars are named figures of the batch, such as the learning rate it
	// used; the run's summary shows each one's mean over the epoch. The
	// host drops names ValidScalarName refuses, names past MaxScalars in a
	// plan, and values that are NaN or infinite.
	Scalars map[string]float64
	// RoundWaitMS is how long the batch's step waited for a Publish or
	// Adopt the core called while Train ran (a round beside training): the
	// time the round held training. A trainer declaring
	// CapTrainsDuringRounds reports it.
	RoundWaitMS float64
}

// Scalar limits. Both the rank and the coordinator hold them, so nothing a
// trainer reports grows the run's summary, its status page or its metrics'
// label set without bound.
const (
	// MaxScalars is the most names a plan's reports keep (the first met),
	// and the most an epoch's summary shows.
	MaxScalars = 32
	// MaxScalarName is the longest name, in bytes.
	MaxScalarName = 64
)

// ValidScalarName reports whether name is 1 to MaxScalarName bytes of
// [a-z0-9_./-]: a JSON key and a Prometheus label value as it is.
func ValidScalarName(name string) bool {
	if len(name) == 0 || len(name) > MaxScalarName {
		return false
	}
	for i := range len(name) {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-') {
			return false
		}
	}
	return true
}

// PublishResult is the state of the parameters just written to the arena.
type PublishResult struct {
	// Steps since the previous Publish: this rank's weight in the round.
	Steps     uint64
	StepCount uint64
	ParamNorm float64
	// HostCopyBytes counts the parameter bytes copied between device and
	// host memory since the previous Publish: the Adopt before it and
	// this Publish (0 for parameters that live in host memory).
	HostCopyBytes uint64
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
	// else is an error. When steps ran since Publish (a round that ran
	// during Train, OverlapRounds), those steps are credited: the result
	// is current + a*(arena - published), a being 1 for an overwrite.
	Adopt(ctx context.Context, blendAlpha float64) (paramNorm float64, err error)
	Evaluate(ctx context.Context) (EvalResult, error)
	// SaveCheckpoint writes the model's parameters, the optimizer's state
	// and the counters into dir, a directory of the trainer's own (the core
	// gives the averager another), and returns the files written.
	SaveCheckpoint(ctx context.Context, dir string) (files []string, err error)
	// LoadCheckpoint restores what SaveCheckpoint wrote into dir (possibly
	// another rank's), as reason says: LoadResume restores everything;
	// LoadReplacement restores the optimizer's state and the counters and
	// leaves the arena as it is, since it holds newer parameters, unless the
	// trainer cannot use them (LoadResult.CheckpointParams).
	LoadCheckpoint(ctx context.Context, dir string, reason LoadReason) (LoadResult, error)
	Shutdown(ctx context.Context) error
}

// LoadReason says why the core calls LoadCheckpoint.
type LoadReason int

const (
	// LoadResume: the run resumes from a checkpoint, before its first
	// round. Restore everything: parameters (into the arena too, for a
	// trainer that trains in it), optimizer state, counters.
	LoadResume LoadReason = iota + 1
	// LoadReplacement: this trainer replaces one the rank lost mid-run.
	// Configure and Attach ran as for the first, and the core put the
	// arena's values back after Attach, so the arena holds the rank's
	// newest parameters (the lost trainer's last Publish, the last round's
	// result, or, for a trainer that trained in the arena, its values when
	// it died), newer than the checkpoint's. Restore the optimizer's state
	// and the counters and leave the arena as it is: the core calls
	// Adopt(0) next. A trainer that cannot use the arena's values (it keeps
	// its parameters at a precision the arena does not hold, say) restores
	// the checkpoint's and says so in LoadResult.CheckpointParams.
	LoadReplacement
)

func (r LoadReason) String() string {
	switch r {
	case LoadResume:
		return "resume"
	case LoadReplacement:
		return "replacement"
	}
	return fmt.Sprintf("LoadReason(%d)", int(r))
}

// LoadResult is what LoadCheckpoint restored.
type LoadResult struct {
	// StepCount is the optimizer step count restored; the restored steps
	// count as published.
	StepCount uint64
	// CheckpointParams, on a LoadReplacement, says the trainer restored the
	// checkpoint's parameters because it cannot use the arena's: the core
	// then calls Publish instead of Adopt, and the rank's next round
	// averages the older values in. A resume always restores them, and
	// ignores this.
	CheckpointParams bool
}

// TLSFiles are a rank's mutual TLS files, absolute paths: CA, the
// authority every side's certificate chains to, and this rank's Cert and
// Key. ServerConfig and ClientConfigFor make TLS 1.3 configurations that
// verify the other side against CA.
type TLSFiles = mtls.Files

// AveragerConfig is what an averager needs to join its group.
type AveragerConfig struct {
	Rank      uint32
	WorldSize uint32
	Arena     arena.Descriptor
	// Endpoint is where the backend meets its peers, for the meeting kind
	// its Describe declared: the reduce server's address for
	// MeetReduceServer, empty for MeetRelay.
	Endpoint string
	// DataKey authenticates the backend's own data channel; it is derived
	// from the run secret and is never the secret itself.
	DataKey  []byte
	Settings json.RawMessage
	RunID    string
	// TLS, when the run's config turns TLS on (worker { tls }), names the
	// rank's mutual TLS files: the averager's channel to the reduce server
	// runs over them, and a vendor's own channel may (TLSFiles' methods
	// make its configurations). Nil: no TLS.
	TLS *TLSFiles
	// Relay exchanges small blobs with the other ranks through the
	// coordinator (an NCCL unique id, a vendor's addresses). Every averager
	// gets one, whatever its meeting kind; it is valid until the next
	// Configure or Shutdown.
	Relay Relay
}

// Relay limits. Every poster receives all ranks' blobs in one control
// frame, so besides each blob's bound the world's blobs together are
// bounded too, under the control protocol's frame limit; an exchange over
// either fails with an error saying so. An averager with more to move
// splits it over several keys.
const (
	// MaxRelayBlob bounds one rank's blob.
	MaxRelayBlob = 4 << 20
	// MaxRelayExchange bounds the blobs of one exchange together.
	MaxRelayExchange = 12 << 20
)

// Relay is an all-gather of small opaque blobs among the live ranks,
// through the coordinator's control protocol: no address, directory or
// port of its own, so it works across hosts and firewalls wherever the
// ranks reach their coordinator.
type Relay interface {
	// Exchange posts blob (at most MaxRelayBlob bytes) under key and waits
	// until every live rank has posted under the same key (before the
	// cohort forms: every rank of the world). It returns each poster's
	// blob by global rank; every poster receives the same map. Keys are
	// the averager's own (say "nccl-id/<generation>"); a key is used once
	// per run. When a rank dies before the exchange completes it fails,
	// for every poster, with an error wrapping ErrRoundAborted, and so
	// does every later post under that key. ctx ending abandons the wait.
	Exchange(ctx context.Context, key string, blob []byte) (map[uint32][]byte, error)
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
	// HostCopyBytes counts the parameter bytes the round copied between
	// device and host memory (0 for an averager that never leaves one of
	// them): a device-resident path reports none.
	HostCopyBytes uint64
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
