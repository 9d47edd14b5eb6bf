// Package record is a run's record: each epoch's figures (loss, samples,
// rounds, waits at the sync, the trainer's scalars), the run's totals,
// every rank's counts, membership events and moves of the eval role, and
// the records of dead ranks. From them it writes what a run leaves and
// shows: summary.json (Summary), metrics.jsonl and curves.png, the live
// status snapshot, and OUT/deaths.
//
// It is fed by events: core/coordinator's loop tells a Recorder what
// happened (a Batch, a Metrics, a round, an epoch's end, a death) and
// never lets it read the run's state; where it must know where the run
// stands (the snapshot, the summary) it asks its Source. Where things are:
//   - record.go: the Recorder, each rank's record, membership and roles
//   - epoch.go: an epoch's figures, and the events that feed them
//   - summary.go: summary.json's types and how the Summary is built
//   - live.go: the status snapshot, metrics.jsonl, curves.png
//   - scalars.go: the trainer's scalars; deaths.go: OUT/deaths
//
// Neighbours: core/status (the snapshot's and the curves' types) and
// core/coordinator/dispatch (ranges, the controller's account) below;
// above it core/coordinator/checkpoint (a checkpoint keeps an
// EpochProgress and the finished EpochSummary list),
// core/coordinator/membership (the role's moves are recorded here) and
// core/coordinator, whose loop feeds it.
package record

import (
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/status"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Now is where the run stands, as its Source says when the Recorder
// publishes or builds the summary.
type Now struct {
	// Phase is the status page's word for it ("training", "saving", ...).
	Phase string
	// Done: the run has ended with Status, and Err when it failed.
	Done   bool
	Status string
	Err    error
	Epoch  uint64 // from 0
	Live   int
	// EpochTotal is the samples of an epoch (0 before formation).
	EpochTotal uint64
	// Checkpoint is the last complete checkpoint, Model the kept trained
	// model's directory.
	Checkpoint string
	Model      string
}

// Source says where the run stands; the coordinator's runner is one.
type Source interface {
	Now() Now
}

// Dispatch is what the record shows of the dispatcher: the cohort's step
// and the controller's account. *dispatch.Dispatcher is one.
type Dispatch interface {
	GlobalStep() uint64
	ControllerSummary() *dispatch.ControllerSummary
	LiveController() status.Controller
}

// Bulk is the averaging data the run's meeting points carried
// (meeting.Table is one).
type Bulk interface {
	Bulk() (rounds, bytes uint64)
}

// Config is what a Recorder starts from.
type Config struct {
	Out         string // the run's out directory
	RunID       string
	World       uint32
	Policy      string
	Trainer     string
	Averager    string
	Epochs      int
	ResumedFrom string
	Started     time.Time

	Source   Source
	Dispatch Dispatch
	Bulk     Bulk
	// Publish receives each new status snapshot.
	Publish func(*status.Snapshot)
	Logger  hclog.Logger
}

// Recorder keeps a run's record. Only the coordinator's loop calls it.
type Recorder struct {
	cfg Config
	log hclog.Logger

	ranks        []rankRecord
	agg          *epochAgg
	epochs       *epochLog
	memberEvents []MembershipEvent
	roles        []RoleElection

	// Run totals for the summary; roundsBefore are a resumed run's rounds
	// before it.
	rounds       uint64
	roundMS      float64
	bytes        float64
	hostCopy     uint64 // SyncAck.host_copy_bytes of live ranks, summed
	roundsBefore uint64

	lastProgress time.Time
	lastLoss     *float64 // the latest batch loss reported, for the progress bar

	lv liveState
}

// rankRecord is what the record knows of one rank.
type rankRecord struct {
	state  string // a status.Rank state: absent, joined, ready, live, exited, dead
	reason string // why it left
	// For the status page: the rank's last frame, the epoch of its last
	// Batch, its last ResourceSample.
	lastHeard time.Time
	epoch     uint64
	res       *wirepb.ResourceSample
	batches   uint64
	samples   uint64
	batchMS   float64
	// stepCount is its last Batch's step count, and death its record once
	// it is declared dead.
	stepCount uint64
	death     *DeathRecord
	// pluginRestarts counts the plugins the rank replaced.
	pluginRestarts uint32
}

// New starts a run's record; every rank is absent.
func New(cfg Config) *Recorder {
	r := &Recorder{
		cfg:    cfg,
		log:    cfg.Logger,
		ranks:  make([]rankRecord, cfg.World),
		lv:     liveState{hist: status.NewHistogram(status.RoundBounds)},
		epochs: newEpochLog(cfg.Out),
	}
	for i := range r.ranks {
		r.ranks[i].state = RankAbsent
	}
	return r
}

// Resumed takes what a resumed run inherits from its checkpoint: the
// rounds before it and the epochs it finished.
func (r *Recorder) Resumed(rounds uint64, finished []EpochSummary) {
	r.roundsBefore = rounds
	if err := r.epochs.reset(finished); err != nil {
		r.log.Warn("keeping the finished epochs", "error", err)
	}
	r.lv.epochs.reset()
	for _, e := range finished {
		r.lv.epochs.add(epochPoint(e))
	}
}

// Finished is every finished epoch of the run, a resumed run's inherited
// ones included, as the record keeps them (EpochsFile).
func (r *Recorder) Finished() EpochSource { return r.epochs }

// RoundsTotal counts the run's rounds, those before a resume included.
func (r *Recorder) RoundsTotal() uint64 { return r.roundsBefore + r.rounds }

// RankState notes rank's move to state (a status.Rank state).
func (r *Recorder) RankState(rank uint32, state string) { r.ranks[rank].state = state }

// Heard notes a frame from rank at t.
func (r *Recorder) Heard(rank uint32, t time.Time) { r.ranks[rank].lastHeard = t }

// Resources notes rank's latest ResourceSample.
func (r *Recorder) Resources(rank uint32, m *wirepb.ResourceSample) { r.ranks[rank].res = m }

// PluginRestarted counts a plugin rank replaced and returns how many it
// has replaced.
func (r *Recorder) PluginRestarted(rank uint32) uint32 {
	r.ranks[rank].pluginRestarts++
	return r.ranks[rank].pluginRestarts
}

// Left notes why rank left the cohort.
func (r *Recorder) Left(rank uint32, reason string) { r.ranks[rank].reason = reason }

// Member records a change of the cohort.
func (r *Recorder) Member(ev MembershipEvent) {
	r.memberEvents = append(r.memberEvents, ev)
	r.noteMembership(ev)
}

// Role records a move of the eval role.
func (r *Recorder) Role(e RoleElection) { r.roles = append(r.roles, e) }
