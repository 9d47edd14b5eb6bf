package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/link"
	"github.com/cohortdl/cohort/core/coordinator/meeting"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
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

// rankStatus is one rank's place in the run.
type rankStatus int

const (
	stAbsent rankStatus = iota // no connection
	stJoined                   // handshake done, Admit sent
	stReady                    // Ready accepted, waiting for the others
	stLive                     // a member of the formed cohort
	stExited                   // sent Exiting
	stDead                     // lost
)

// rankState is what the loop knows of one rank.
type rankState struct {
	id     uint32
	status rankStatus
	link   *link.Link
	ready  *wirepb.Ready
}

// rankStates are the statuses as the report and the status page name them.
var rankStates = [...]string{stAbsent: record.RankAbsent, stJoined: record.RankJoined, stReady: record.RankReady,
	stLive: record.RankLive, stExited: record.RankExited, stDead: record.RankDead}

// runner is the state of one Run, owned by the loop goroutine.
type runner struct {
	c      *Coordinator
	cfg    *config.Config
	log    hclog.Logger
	events chan link.Event
	slots  *link.Slots
	wg     sync.WaitGroup // connection goroutines and senders
	ctx    context.Context

	world     uint32
	policy    config.Policy
	hbTimeout time.Duration

	ranks        []*rankState
	phase        phase
	started      time.Time
	formDeadline time.Time
	refusals     []string

	pickSpace uint64
	batch     uint64

	epoch      uint64
	disp       *dispatch.Dispatcher
	rep        *record.Recorder
	round      *round
	reissue    *reissue
	roundSeq   uint64
	session    *sessionReq
	generation uint64
	meet       *meeting.Hub
	role       uint32 // the eval role's rank: evaluation, epoch callback, model export
	snap       checkpoint.Progress

	evalTarget   int64 // -1: no evaluation pending
	ckpt         *checkpoint.Wait
	save         *checkpoint.Wait
	export       *checkpoint.Export
	exitDeadline time.Time

	stopReq    bool
	saveStatus string // the status a ShutdownWithSave ends with
	saveErr    error
	status     string
	err        error

	hbSeq  uint64      // the last CoordinatorHeartbeat's sequence
	deathQ []deathNote // deaths found by the current handler, for advance

	liveIDs []uint32 // live()'s answer while liveOK
	liveOK  bool
}

func newRunner(c *Coordinator) *runner {
	cfg := c.cfg
	world := uint32(cfg.Run.Ranks)
	r := &runner{
		c:          c,
		cfg:        cfg,
		log:        c.log,
		events:     make(chan link.Event, 256),
		slots:      link.NewSlots(world),
		world:      world,
		policy:     cfg.Coordinator.Policy,
		hbTimeout:  cfg.Coordinator.HeartbeatTimeout,
		evalTarget: -1,
		export:     checkpoint.NewExport(c.out, c.log),
		started:    time.Now(),
	}
	for i := range world {
		r.ranks = append(r.ranks, &rankState{id: i})
	}
	r.disp = dispatch.New(cfg, r.log)
	r.meet = meeting.NewHub(c.meetings, r, r.log)
	r.rep = record.New(record.Config{
		Out: c.out, RunID: c.runID, World: world, Policy: string(r.policy),
		Trainer: cfg.Trainer.Name, Averager: cfg.Averager.Name, Epochs: cfg.Run.Epochs,
		ResumedFrom: c.resume, Started: r.started,
		Source: r, Dispatch: r.disp, Bulk: c.meetings, Publish: c.snapshot.Store, Logger: r.log,
	})
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
		Options:  r.wireOptions(),
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
	stopCh := r.c.stopCh
	r.rep.OpenJournal()
	defer r.rep.CloseJournal()
	pub := time.NewTicker(record.PublishEvery)
	defer pub.Stop()
	r.rep.Publish(true)
	timer := r.c.opts.LoopTimer

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
			r.heartbeat()
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
		if timer != nil && !start.IsZero() {
			if what == "" {
				what = ev.String()
			}
			timer(what, time.Since(start))
		}
	}

	// Teardown: close every link (which ends readers and senders), stop
	// accepting, and wait for every goroutine.
	r.c.ln.Close()
	for _, rs := range r.ranks {
		if rs.link != nil {
			rs.link.Close()
		}
	}
	cancel()
	r.wg.Wait()
	r.rep.Publish(true)
	return r.rep.Summary(), r.err
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
		if len(r.deathQ) > 0 {
			d := r.deathQ[0]
			r.deathQ = r.deathQ[1:]
			r.lose(r.ranks[d.rank], d.reason)
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
	if r.stepSession() {
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
	rs := r.ranks[ev.Rank]
	switch ev.Kind {
	case link.Joined:
		r.onJoined(rs, ev.Conn)
	case link.Down:
		if rs.link == nil || rs.link.Conn() != ev.Conn {
			return // a connection already replaced or dropped
		}
		r.onLinkDown(rs, ev.Err)
	case link.Message:
		if rs.link == nil || rs.link.Conn() != ev.Conn {
			return
		}
		r.onMessage(rs, ev.Msg)
	}
}

// send queues msg for rs; a rank whose queue is full is not reading and
// is noted dead.
func (r *runner) send(rs *rankState, msg proto.Message) {
	if rs.link == nil || rs.status == stDead {
		return
	}
	if !rs.link.Queue(msg) {
		r.noteDeath(rs.id, fmt.Sprintf("not reading: %d control frames queued", link.OutboxSize))
	}
}

// Send queues msg for rank: the meeting hub's outbox.
func (r *runner) Send(rank uint32, msg proto.Message) { r.send(r.ranks[rank], msg) }

// live returns the ranks of the formed cohort that are still in it, in
// ascending order. The state machine asks after every event, so the list
// is kept between changes to it: a slice made anew on each change and
// never modified after, so a caller may hold it (a NewSession's members)
// but must not change it.
func (r *runner) live() []uint32 {
	if !r.liveOK {
		var out []uint32
		for _, rs := range r.ranks {
			if rs.status == stLive {
				out = append(out, rs.id)
			}
		}
		r.liveIDs, r.liveOK = out, true
	}
	return r.liveIDs
}

// setStatus moves rs to st, the only way a rank's status changes, so that
// live() knows when to look again.
func (r *runner) setStatus(rs *rankState, st rankStatus) {
	if (rs.status == stLive) != (st == stLive) {
		r.liveOK = false
	}
	rs.status = st
	r.rep.RankState(rs.id, rankStates[st])
}

func (r *runner) broadcast(msg proto.Message) {
	for _, id := range r.live() {
		r.send(r.ranks[id], msg)
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
func (r *runner) onMessage(rs *rankState, msg proto.Message) {
	r.rep.Heard(rs.id, time.Now())
	switch m := msg.(type) {
	case *wirepb.Heartbeat:
	case *wirepb.Ready:
		r.onReady(rs, m)
	case *wirepb.Batch:
		r.onBatch(rs, m)
	case *wirepb.Metrics:
		r.onMetrics(rs, m)
	case *wirepb.SyncAck:
		r.onSyncAck(rs, m)
	case *wirepb.SnapshotReady:
		r.log.Trace("snapshot ready", "rank", rs.id, "round", m.GetRound())
	case *wirepb.EvalResult:
		r.onEvalResult(rs, m)
	case *wirepb.CheckpointResult:
		r.onCheckpointResult(rs, m)
	case *wirepb.SessionIdGenerated:
		r.onSessionID(rs, m)
	case *wirepb.EpochFnElapsed:
		r.log.Debug("epoch callback ran", "rank", rs.id, "epoch", m.GetEpoch(), "ms", m.GetElapsedMs())
	case *wirepb.ResourceSample:
		r.rep.Resources(rs.id, m)
	case *wirepb.Exiting:
		r.onExiting(rs)
	case *wirepb.MeetRequest:
		r.meet.Request(rs.id, m)
	case *wirepb.RelayPost:
		r.meet.Post(rs.id, m, r.live(), r.phase == phForming)
	case *wirepb.PluginRestarted:
		r.onPluginRestarted(rs, m)
	default:
		r.log.Warn("ignoring an unexpected frame", "rank", rs.id, "type", fmt.Sprintf("%T", msg))
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
	p.Live = len(r.live())
	if p.Total == 0 {
		p.Total = r.pickSpace
	}
	r.c.opts.Progress(p)
}

// Now is where the run stands, for the report's snapshot and summary.
func (r *runner) Now() record.Now {
	return record.Now{Phase: r.phase.String(), Done: r.phase == phDone, Status: r.status, Err: r.err,
		Epoch: r.epoch, Live: len(r.live()), EpochTotal: r.pickSpace, Checkpoint: r.c.ckpts.Last(), Model: r.export.Model()}
}

// wireOptions are the options of every rank connection's handshake and
// frames.
func (r *runner) wireOptions() []wire.Option {
	opts := []wire.Option{wire.WithIdleTimeout(r.hbTimeout), wire.WithTLS(r.c.tls)}
	if d := r.c.opts.HandshakeTimeout; d > 0 {
		opts = append(opts, wire.WithHandshakeTimeout(d))
	}
	return opts
}
