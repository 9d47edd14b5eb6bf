// Package dispatch decides which samples each rank trains and when the
// cohort averages: an epoch's sample ranges (per-rank partitions under the
// sync policy, one shared pool under cadence and async), the plans handed
// out of them and each rank's queue of open plans, the window sizes (the
// cadence policy's ElChe sizing, the adaptive controller's sync interval
// and learning-rate scale), async throttling, and what a lost rank's plans
// give back. Its central call is NextPlans(live): the next plan of each
// live rank, recorded as that rank's until its Metrics closes it.
//
// A Dispatcher holds no goroutine and sends nothing: core/coordinator's
// loop, the one goroutine that owns the run, feeds it the ranks' Batch and
// Metrics reports and the rounds' outcomes, and sends the plans it returns.
// Where things are:
//   - dispatch.go: the Dispatcher, an epoch's start and resumption, the
//     checkpoint's view of the work
//   - plans.go: windows, async chunks, solo plans, Batch and Metrics
//   - rounds.go: what a round averages, async rounds and throttling, the
//     controller's and the cadence's verdicts after each round
//   - handback.go: a lost rank's work, and where it goes
//   - work.go: sample ranges and an epoch's undispatched work
//   - cadence.go, controller.go: window sizing and the adaptive controller
//
// Neighbours: core/config, core/status (the controller as the status page
// shows it) and core/wire/wirepb below; above it core/coordinator/record
// (which shows the controller's decisions and the ranges a dead rank gave
// back), core/coordinator/checkpoint (which keeps a Snapshot and the
// controller's and cadence's states), core/coordinator/membership (whose
// eval role asks the ranks' batch times) and core/coordinator, whose loop
// drives it.
package dispatch

import (
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
)

// Dispatcher is the dispatch state of one run. Only the coordinator's
// loop calls it.
type Dispatcher struct {
	cfg    *config.Config
	log    hclog.Logger
	policy config.Policy
	world  uint32

	pickSpace uint64
	batch     uint64

	epoch        uint64
	work         *epochWork
	queues       []queue
	win          *window
	lastWindowMS float64
	cad          *cadence
	ctl          *controller

	// batches counts every batch the ranks reported in this process, and
	// stepsBefore the global step a resumed run started from.
	batches     uint64
	stepsBefore uint64
}

// queue is what the dispatcher knows of one rank's work.
type queue struct {
	outstanding []*Plan // dispatched, not yet closed by Metrics, in order
	sinceRound  uint64  // batches not yet averaged in a completed round
	// since is sinceRound when the round in flight was issued: what that
	// round averages. Batches reported after (a rank training while its
	// round runs) are for the next one.
	since uint64
	// throttled: sent Throttle (async, max_batch_diff) since the last Sync.
	throttled   bool
	lastMetrics time.Time
	// batchMS is a moving average of the rank's reported batch times.
	batchMS float64
	// unaveraged and published: see unaveraged.go.
	unaveraged []Span
	published  int
}

// New is the dispatcher of a run of cfg; the controller's decisions are
// logged to log.
func New(cfg *config.Config, log hclog.Logger) *Dispatcher {
	d := &Dispatcher{
		cfg:    cfg,
		log:    log,
		policy: cfg.Coordinator.Policy,
		world:  uint32(cfg.Run.Ranks),
		queues: make([]queue, cfg.Run.Ranks),
	}
	d.ctl = newController(cfg.Coordinator, d.logDecision)
	return d
}

// Form takes the cohort's data set (pickSpace samples in batches of
// batch) and whether its optimizer is adaptive at formation, when the
// epoch's batch count is known, and builds the cadence policy's sizing; a
// resumed run continues from the checkpoint's window sizes (cad, nil for a
// fresh run).
func (d *Dispatcher) Form(pickSpace, batch uint64, adaptive bool, cad *CadenceState) {
	d.pickSpace, d.batch = pickSpace, batch
	d.ctl.form(adaptive)
	if d.policy != config.PolicyCadence {
		return
	}
	base := uint64(d.cfg.Coordinator.ChunkBatches)
	if base == 0 {
		base = uint64(d.cfg.Coordinator.SyncEvery)
	}
	epochBatches := (d.pickSpace + d.batch - 1) / d.batch
	d.cad = newCadence(base, epochBatches, d.cfg.Coordinator.OverheadTarget)
	d.cad.maxDiff = uint64(d.cfg.Coordinator.MaxBatchDiff)
	d.cad.minBase = min(uint64(max(d.cfg.Coordinator.SyncEveryMin, 1)), d.cad.base)
	d.cad.restore(cad)
}

// Windowed reports whether the policy hands out work in windows that all
// close at one round (sync, cadence), rather than streaming it (async).
func (d *Dispatcher) Windowed() bool { return d.policy != config.PolicyAsync }

// shared reports whether the policy draws chunks from one epoch pool
// instead of per-rank partitions: under cadence and async a faster rank
// must be able to take more than an equal share.
func (d *Dispatcher) shared() bool { return d.policy != config.PolicySync }

// StartEpoch splits epoch e over the live ranks.
func (d *Dispatcher) StartEpoch(e uint64, live []uint32) {
	d.epoch = e
	// The last epoch ended with a round: its work is in the consensus.
	for i := range d.queues {
		d.queues[i].unaveraged, d.queues[i].published = nil, 0
	}
	d.work = newEpochWork(e, d.pickSpace, live, d.shared())
}

// Resumed is where a checkpoint left an epoch's work.
type Resumed struct {
	Epoch     uint64
	Remaining []RankRanges
	Pool      []Range
	// GlobalStep is the cohort's step count at the save.
	GlobalStep uint64
}

// Resume rebuilds the epoch in progress from a checkpoint: each rank keeps
// its remaining partition when the live ranks are those that saved and the
// policy partitions; otherwise every remaining sample is split again (or
// pooled). It reports whether the partitions were kept.
func (d *Dispatcher) Resume(m Resumed, live []uint32) (same bool) {
	d.stepsBefore = m.GlobalStep
	d.epoch = m.Epoch
	w := &epochWork{epoch: m.Epoch, parts: map[uint32][]Range{}}
	same = len(m.Remaining) == len(live) && len(m.Pool) == 0 && !d.shared()
	for i, rr := range m.Remaining {
		same = same && rr.Rank == live[i]
	}
	if same {
		for _, rr := range m.Remaining {
			w.parts[rr.Rank] = slices.Clone(rr.Ranges)
		}
	} else {
		var all []Range
		for _, rr := range m.Remaining {
			all = append(all, rr.Ranges...)
		}
		all = append(all, m.Pool...)
		if d.shared() {
			w.pool = all
		} else {
			for i, rs := range splitRanges(all, equalSizes(sumRanges(all), len(live))) {
				w.parts[live[i]] = rs
			}
		}
	}
	d.work = w
	return same
}

// RestoreController continues the controller from a checkpoint's state
// and the window the original run handed out after the save point.
func (d *Dispatcher) RestoreController(s *ControllerState, w *ControllerWindow) {
	d.ctl.restore(s, w)
}

// EndEpoch marks the epoch's work done: nothing is dispatched until the
// next StartEpoch.
func (d *Dispatcher) EndEpoch() { d.work = nil }

// Training reports whether an epoch's work is in hand (round 0 done, the
// epoch not ended).
func (d *Dispatcher) Training() bool { return d.work != nil }

// Remaining is the number of samples of the epoch not yet dispatched.
func (d *Dispatcher) Remaining() uint64 { return d.work.remaining() }

// GlobalStep is the cohort's optimizer step count in one rank's terms: the
// batches every rank trained, divided by the world size. A trainer's
// learning-rate schedule follows it, so it advances as a single rank's own
// count would (and as a DDP run of the same world's would), whichever rank
// did the work.
func (d *Dispatcher) GlobalStep() uint64 {
	return d.stepsBefore + d.batches/uint64(d.world)
}

// BatchMS is rank's smoothed batch time in milliseconds, 0 before its
// first report.
func (d *Dispatcher) BatchMS(rank uint32) float64 { return d.queues[rank].batchMS }

// Snapshot is the work of an epoch as a checkpoint keeps it: the samples
// not yet averaged into the model, per rank and shared, and the
// controller's state with the window it hands (or will hand) next.
type Snapshot struct {
	Epoch      uint64
	Remaining  map[uint32][]Range
	Pool       []Range
	Controller ControllerState
	Window     ControllerWindow
}

// Snapshot is the state of the epoch as the models of the last round see
// it: everything not yet dispatched plus every plan still open.
func (d *Dispatcher) Snapshot(live []uint32) Snapshot {
	p := Snapshot{Epoch: d.epoch, Remaining: map[uint32][]Range{}, Controller: d.ctl.state(), Window: d.ctl.window()}
	if d.work == nil {
		return p
	}
	for _, id := range live {
		var rs []Range
		for _, pl := range d.queues[id].outstanding {
			rs = append(rs, pl.rng)
		}
		rs = append(rs, d.work.parts[id]...)
		p.Remaining[id] = rs
	}
	p.Pool = slices.Clone(d.work.pool)
	return p
}

// FreshSnapshot is the start of epoch e, split over the live ranks. Past
// the run's last epoch too: a run resumed with more epochs trains e in
// full, while one resumed with the same number knows from e alone that it
// is finished.
func (d *Dispatcher) FreshSnapshot(e uint64, live []uint32) Snapshot {
	p := Snapshot{Epoch: e, Remaining: map[uint32][]Range{}, Controller: d.ctl.state(), Window: d.ctl.window()}
	w := newEpochWork(e, d.pickSpace, live, d.shared())
	for _, id := range live {
		p.Remaining[id] = w.parts[id]
	}
	p.Pool = w.pool
	return p
}
