package coordinator

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/link"
	"github.com/cohortdl/cohort/core/coordinator/meeting"
	"github.com/cohortdl/cohort/core/coordinator/membership"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// phase is where the run stands.
type phase int

const (
	phForming    phase = iota // waiting for every rank's Ready
	phTraining                // round 0, then windows and rounds of an epoch
	phEval                    // waiting for the epoch's EvalResult
	phCheckpoint              // waiting for the epoch's CheckpointResults
	phExport                  // after the last epoch, waiting for one rank's model
	phShutdown                // Shutdown sent, waiting for Exiting
	phSaving                  // ShutdownWithSave sent, waiting for saves and Exiting
	phDone
)

func (p phase) String() string {
	return [...]string{"forming", "training", "evaluating", "checkpointing", "exporting", "shutting down", "saving", "done"}[p]
}

// runner is the state of one Run, owned by the loop goroutine.
type runner struct {
	c      *Coordinator
	cfg    *config.Config
	log    hclog.Logger
	events chan link.Event
	slots  *link.Slots
	wg     sync.WaitGroup // connection goroutines and senders
	ctx    context.Context

	world  uint32
	policy config.Policy

	ranks        *membership.Roster
	sessions     *membership.Sessions
	role         *membership.Role
	disp         *dispatch.Dispatcher
	rep          *record.Recorder
	meet         *meeting.Hub
	phase        phase
	started      time.Time
	formDeadline time.Time

	pickSpace uint64
	batch     uint64

	epoch    uint64
	round    *round
	reissue  *reissue
	roundSeq uint64
	snap     checkpoint.Progress
	// consRound is the last completed round's number (the consensus file's
	// round); cb is a comeback's first round (comeback.go).
	consRound  uint64
	consWarned bool
	cb         *comebackPlan

	ckpt         *checkpoint.Wait
	save         *checkpoint.Wait
	export       *checkpoint.Export
	exitDeadline time.Time

	stopReq    bool
	saveStatus string // the status a ShutdownWithSave ends with
	saveErr    error
	status     string
	err        error
}

func newRunner(c *Coordinator) *runner {
	cfg := c.cfg
	world := uint32(cfg.Run.Ranks)
	r := &runner{
		c:       c,
		cfg:     cfg,
		log:     c.log,
		events:  make(chan link.Event, 256),
		slots:   link.NewSlots(world),
		world:   world,
		policy:  cfg.Coordinator.Policy,
		export:  checkpoint.NewExport(c.out, c.log),
		started: time.Now(),
	}
	if c.comeback != nil {
		r.roundSeq = c.comeback.NextRound
	}
	r.disp = dispatch.New(cfg, r.log)
	r.rep = record.New(record.Config{
		Out: c.out, RunID: c.runID, World: world, Policy: string(r.policy),
		Trainer: cfg.Trainer.Name, Averager: cfg.Averager.Name, Epochs: cfg.Run.Epochs,
		ResumedFrom: c.resume, Started: r.started,
		Source: r, Dispatch: r.disp, Bulk: c.meetings, Publish: c.snapshot.Store, Logger: r.log,
	})
	r.ranks = membership.NewRoster(membership.Config{
		World: world, Slots: r.slots, HeartbeatTimeout: cfg.Coordinator.HeartbeatTimeout,
		Start: func(l *link.Link) {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				l.Run(r.ctx, r.events)
			}()
		},
		Changed: func(rank uint32, st membership.Status) { r.rep.RankState(rank, st.String()) },
		Dropped: func(rank uint32) { r.meet.Left(rank) },
		Logger:  r.log,
	})
	r.sessions = membership.NewSessions(r.ranks, c.sessionTimeout(), r.log)
	r.role = membership.NewRole(cfg.Coordinator, r.ranks, r.disp, r.rep.Role, r.log)
	r.meet = meeting.NewHub(c.meetings, r.ranks, r.log)
	return r
}

// run is the loop.
func (r *runner) run(parent context.Context) (*record.Summary, error) {
	ctx, cancel := context.WithCancel(parent)
	r.ctx = ctx
	r.formDeadline = r.started.Add(r.cfg.Coordinator.FormationTimeout)
	r.log.Info("control server listening", "addr", r.c.ln.Addr().String(), "run_id", r.c.runID,
		"ranks", r.world, "policy", r.policy, "out", r.c.out, "tls", r.c.tls != nil)

	srv := &link.Server{
		Listener: r.c.ln,
		Keys:     r.c.opts.Keys,
		Slots:    r.slots,
		Options:  r.c.wireOptions(),
		Events:   r.events,
		Logger:   r.log,
		WG:       &r.wg,
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		srv.Serve(ctx)
	}()

	hbEvery := r.c.opts.HeartbeatInterval
	if hbEvery <= 0 {
		hbEvery = time.Second
	}
	hb := time.NewTicker(hbEvery)
	defer hb.Stop()
	// One timer for the nearest deadline, re-armed after every move: an
	// idle coordinator (a long epoch) then sleeps instead of polling.
	deadline := time.NewTimer(time.Hour)
	defer deadline.Stop()
	r.rep.OpenJournal()
	defer r.rep.CloseJournal()
	pub := time.NewTimer(time.Hour)
	pub.Stop()
	defer pub.Stop()
	r.rep.Publish(true)
	timer := r.c.opts.LoopTimer

	crash := func() (crash error) {
		// A panic on the loop is a coordinator that failed, not a run
		// that did: the ranks are told nothing, its links close below,
		// and the consensus file stays for a coordinator that comes back.
		defer func() {
			if p := recover(); p != nil {
				crash = fmt.Errorf("%w: %v\n%s", ErrCrashed, p, debug.Stack())
			}
		}()
		r.loop(parent, hb, deadline, pub, timer)
		return nil
	}()

	// Teardown: close every link (which ends readers and senders), stop
	// accepting, and wait for every goroutine.
	r.c.ln.Close()
	r.ranks.Close()
	cancel()
	r.wg.Wait()
	if crash != nil {
		r.log.Error("the coordinator failed; its ranks wait for one to come back", "error", crash)
		return r.rep.Summary(), crash
	}
	r.rep.Publish(true)
	return r.rep.Summary(), r.err
}

// ErrCrashed is wrapped by Run's error when the coordinator itself failed
// (a panic on its loop) rather than the run: the ranks keep their models
// for a coordinator that comes back (Options.Resume on the run's out
// directory, on the same address).
var ErrCrashed = errors.New("coordinator: crashed")

// loop is the run's event loop, until the run is done.
func (r *runner) loop(parent context.Context, hb *time.Ticker, deadline *time.Timer, pub *time.Timer, timer func(string, time.Duration)) {
	stopCh := r.c.stopCh
	for r.phase != phDone {
		if next, ok := r.nextDeadline(); ok {
			deadline.Reset(time.Until(next))
		} else {
			deadline.Stop()
		}
		var ev link.Event
		var start time.Time
		what := ""
		select {
		case ev = <-r.events:
			start = time.Now()
			r.onEvent(ev)
		case <-hb.C:
			start, what = time.Now(), "tick"
			r.ranks.Heartbeat()
		case <-pub.C:
		case <-deadline.C:
			start, what = time.Now(), "deadline"
			r.checkDeadlines(start)
		case <-stopCh:
			start, what = time.Now(), "stop"
			stopCh = nil
			r.requestStop()
		case <-parent.Done():
			r.finish(record.StatusFailed, fmt.Errorf("coordinator: run abandoned: %w", context.Cause(parent)))
		}
		r.advance()
		r.rep.Publish(r.phase == phDone)
		if wait, ok := r.rep.PublishDue(); ok {
			pub.Reset(wait)
		} else {
			pub.Stop()
		}
		if timer != nil && !start.IsZero() {
			if what == "" {
				what = ev.String()
			}
			timer(what, time.Since(start))
		}
	}
}

// finish ends the run with status; a failure keeps the first error.
func (r *runner) finish(status string, err error) {
	if r.phase == phDone {
		return
	}
	r.status = status
	if err != nil && r.err == nil {
		r.err = err
	}
	if status == record.StatusFailed && r.err == nil {
		r.err = errors.New("coordinator: run failed")
	}
	if status != record.StatusFailed {
		r.err = nil
	}
	r.phase = phDone
	if err := r.c.ckpts.RemoveConsensus(); err != nil {
		r.log.Warn("the run ended", "error", err)
	}
	if r.save != nil && !r.save.Resolved() {
		r.resolveCkpt(r.save)
	}
	if r.ckpt != nil && !r.ckpt.Resolved() {
		r.c.ckpts.Abandon(r.ckpt)
	}
	if status == record.StatusFailed {
		r.log.Error("run failed", "error", r.err)
	} else {
		r.log.Info("run ended", "status", status)
	}
}

// advance applies deaths noted while handling an event, then moves the
// state machine as far as the current state allows.
func (r *runner) advance() {
	for range 1000 {
		if id, reason, ok := r.ranks.NextDeath(); ok {
			if r.ranks.Lost(id, reason) {
				r.depart(id, record.EventDead, reason, membership.Dead)
			}
			continue
		}
		if !r.step() {
			return
		}
	}
	r.log.Error("state machine did not settle; this is a bug", "phase", r.phase.String())
}

// step makes one move; false means nothing can move until the next event.
func (r *runner) step() bool {
	switch r.phase {
	case phForming:
		return r.tryForm()
	case phDone:
		return false
	}
	if r.sessions.Step(r.round != nil) {
		return true
	}
	switch r.phase {
	case phTraining:
		return r.stepTraining()
	case phShutdown, phSaving:
		return r.checkExits()
	}
	return false
}

// onEvent handles one event from a connection goroutine.
func (r *runner) onEvent(ev link.Event) {
	if ev.Rank >= r.world {
		return // the handshake refuses these; never index with one
	}
	id := ev.Rank
	switch ev.Kind {
	case link.Joined:
		if r.phase != phForming || r.ranks.Status(id) != membership.Absent {
			// The slot check makes this impossible; never let a second
			// connection take over a rank.
			r.log.Warn("dropping an unexpected connection", "rank", id, "phase", r.phase.String())
			ev.Conn.Close()
			return
		}
		// Admit: what every rank must share to train together.
		r.ranks.Join(id, ev.Conn)
		r.ranks.Send(id, r.c.admit())
	case link.Down:
		if !r.ranks.Current(id, ev.Conn) {
			return // a connection already replaced or dropped
		}
		r.ranks.LinkDown(id, ev.Err)
	case link.Message:
		if !r.ranks.Current(id, ev.Conn) {
			return
		}
		r.onMessage(id, ev.Msg)
	}
}

// requestStop takes Stop to the run: before formation it ends at once;
// otherwise dispatch stops and training saves once what is in flight is
// averaged.
func (r *runner) requestStop() {
	if r.stopReq {
		return
	}
	r.stopReq = true
	switch r.phase {
	case phForming:
		r.log.Info("stop requested before the cohort formed")
		r.finish(record.StatusStopped, nil)
	case phShutdown, phSaving, phDone:
	default:
		r.log.Info("stop requested: finishing the plans in flight, then a final round and a save")
	}
}

// onMessage routes one frame. The link's rank is the one the handshake
// authenticated; rank fields inside messages are not trusted.
func (r *runner) onMessage(id uint32, msg proto.Message) {
	r.rep.Heard(id, time.Now())
	switch m := msg.(type) {
	case *wirepb.Heartbeat:
	case *wirepb.Ready:
		if r.phase != phForming || r.ranks.Status(id) != membership.Joined {
			r.log.Warn("ignoring a Ready outside formation", "rank", id, "phase", r.phase.String())
			return
		}
		r.ranks.Ready(id, m)
	case *wirepb.Batch:
		r.onBatch(id, m)
	case *wirepb.Metrics:
		r.onMetrics(id, m)
	case *wirepb.SyncAck:
		r.onSyncAck(id, m)
	case *wirepb.SnapshotReady:
		r.log.Trace("snapshot ready", "rank", id, "round", m.GetRound())
		if rd := r.round; rd != nil && rd.num == m.GetRound() && rd.waiting[id] && rd.mode == wirepb.SyncMode_SYNC_MODE_AVERAGE {
			r.disp.Published(id)
		}
	case *wirepb.EvalResult:
		r.onEvalResult(id, m)
	case *wirepb.CheckpointResult:
		r.onCheckpointResult(id, m)
	case *wirepb.SessionIdGenerated:
		r.sessions.OnID(id, m)
	case *wirepb.EpochFnElapsed:
		r.log.Debug("epoch callback ran", "rank", id, "epoch", m.GetEpoch()+1, "ms", m.GetElapsedMs())
	case *wirepb.ResourceSample:
		r.rep.Resources(id, m)
	case *wirepb.Exiting:
		if r.ranks.Exiting(id, r.phase == phShutdown || r.phase == phSaving) {
			r.depart(id, record.EventLeft, "sent Exiting before the run ended", membership.Exited)
		}
	case *wirepb.MeetRequest:
		r.meet.Request(id, m)
	case *wirepb.RelayPost:
		r.meet.Post(id, m, r.ranks.Live(), r.phase == phForming)
	case *wirepb.PluginRestarted:
		r.onPluginRestarted(id, m)
	default:
		r.log.Warn("ignoring an unexpected frame", "rank", id, "type", fmt.Sprintf("%T", msg))
	}
}

// emit reports p to Options.Progress, with where the run stands.
func (r *runner) emit(p Progress) {
	if r.c.opts.Progress == nil {
		return
	}
	p.Epoch = r.epoch
	p.Epochs = r.cfg.Run.Epochs
	p.World = int(r.world)
	p.Live = len(r.ranks.Live())
	if p.Total == 0 {
		p.Total = r.pickSpace
	}
	r.c.opts.Progress(p)
}

// Now is where the run stands, for the record's snapshot and summary.
func (r *runner) Now() record.Now {
	return record.Now{Phase: r.phase.String(), Done: r.phase == phDone, Status: r.status, Err: r.err,
		Epoch: r.epoch, Live: len(r.ranks.Live()), EpochTotal: r.pickSpace, Checkpoint: r.c.ckpts.Last(), Model: r.export.Model()}
}
