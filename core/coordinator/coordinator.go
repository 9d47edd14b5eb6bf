// Package coordinator drives a cohort of rank workers through a training
// run: it accepts them, forms the cohort, runs each epoch's windows and
// averaging rounds under the configured policy, evaluates, checkpoints and
// ends the run, whatever ranks it loses on the way. docs/protocol.md is the
// conversation it holds with each rank.
//
// One goroutine, the loop (runner), owns all run state and is the only
// caller of the packages below it, each of which has one job:
//
//   - link: connections, handshakes, each rank's sender; turns frames into
//     Events for the loop
//   - membership: who is in the cohort (Roster: statuses, links, the one
//     way to send a rank a frame, liveness, formation checks), the
//     re-formation of the averaging group (Sessions), the eval role (Role)
//   - dispatch: which samples each rank trains and when the cohort
//     averages (NextPlans(live), windows, async chunks, the cadence and the
//     adaptive controller, what a lost rank gives back)
//   - record: the run's record, fed by events (epoch figures, totals,
//     summary.json, metrics.jsonl, curves.png, the status snapshot, death
//     records)
//   - checkpoint: checkpoints on disk, meta.json, resuming, the model
//     export
//   - meeting: where the averagers meet (meeting points, the relay)
//
// The dependency graph is a DAG with this package on top: checkpoint
// builds on record, which builds on dispatch; membership on record and
// link; none of them imports this package. This package keeps the run's
// sequencing: the phase, rounds, the moves of training, an epoch's life,
// what a departure means for the run, and when to save.
//
// Where things are:
//   - coordinator.go: Options, New and Run
//   - loop.go: the loop, and the routing of each event and frame
//   - rounds.go: averaging rounds (Sync, SyncAck, Update, a retry after an
//     abort), the plans they deliver, the checkpoint snapshot they fix
//   - training.go: the training phase's moves, Batch and Metrics
//   - lifecycle.go: training's start, epoch start and end, evaluation,
//     shutdown
//   - membership.go: formation, a rank's departure, a replaced plugin
//   - saves.go: when the run checkpoints, saves and exports its model
//   - comeback.go: the consensus file, and taking back the ranks of a
//     coordinator that died
//   - deadlines.go: the timeouts the loop sleeps until
//
// The life of a SyncAck, from the link to its effect:
//
//  1. link.Server's reader for the rank decodes the frame and hands the
//     loop a link.Event{Kind: link.Message}.
//  2. loop.go: run takes the event; onEvent drops it if its connection is
//     no longer the rank's (membership.Roster.Current); onMessage notes the
//     frame (record.Recorder.Heard) and routes it to onSyncAck.
//  3. rounds.go: onSyncAck checks it answers the round in flight and, if
//     the rank's round succeeded, tells dispatch (Dispatcher.Averaged: the
//     batches the round averaged are behind the rank, the plan it held for
//     the round may start). checkRound waits for every live rank's ack; if
//     any aborted, the round runs again once the group is re-formed.
//     Otherwise completeRound records it (record.Recorder.Round: totals,
//     round curve, metrics.jsonl), lets dispatch learn from it
//     (Dispatcher.RoundDone: the controller's divergence rules, the
//     cadence's window), fixes the checkpoint snapshot (progressNow), and
//     deliver queues each live rank its Update, carrying its next plan
//     from Dispatcher.NextPlans(live), through membership.Roster.Send onto
//     the rank's link.Link, whose sender goroutine writes it.
//  4. lifecycle.go, for round 0 only: its completion starts training
//     (startTraining).
//
// Back in loop.go, advance then makes whatever moves the new state allows
// (the next round, the epoch's end, a pending NewSession).
package coordinator

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/meeting"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/status"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Options configure a Coordinator. Config and Keys are required.
type Options struct {
	Config *config.Config
	// Keys are derived from the run's secret; a rank holding another
	// secret fails the handshake.
	Keys wire.Keys
	// Listener, when set, is used instead of listening on
	// Config.Coordinator.Listen; the coordinator closes it.
	Listener net.Listener
	// Out is the run's output directory; empty means Config.Run.Out.
	Out string
	// Resume is a checkpoint to continue from: a checkpoint directory, a
	// run's out directory or its checkpoints directory.
	Resume string
	// Meetings add meeting kinds to the built-in ones (the relay, the
	// reduce server) or replace them: an averager whose Describe declares
	// such a kind meets at the point its factory starts.
	Meetings map[string]meeting.Factory
	Logger   hclog.Logger
	// Progress, when set, is called on the coordinator's loop as the run
	// advances; it must return quickly.
	Progress func(Progress)
	// LoopTimer, when set, is called on the loop after each thing it woke
	// for, with what that was (a rank's frame by its message name, such as
	// "Heartbeat" or "Batch"; else "joined", "link down", "tick",
	// "deadline" or "stop") and how long the loop spent on it, the moves it
	// caused included: the loop's cost per event, for measuring how the
	// coordinator scales. It must return quickly.
	LoopTimer func(what string, d time.Duration)

	// HandshakeTimeout bounds a connection's handshake: one that has not
	// sent a valid hello by then is dropped (default
	// wire.DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// HeartbeatInterval is the CoordinatorHeartbeat period (default 1 s).
	HeartbeatInterval time.Duration
	// ExitTimeout bounds the wait for Exiting after Shutdown (default 30 s).
	ExitTimeout time.Duration
	// SaveTimeout bounds a ShutdownWithSave: the ranks' saves and exits
	// (default 5 min).
	SaveTimeout time.Duration
	// SessionTimeout is how long a survivor gets to answer
	// RequestSessionId before the next one is asked (default the larger of
	// 5 s and the heartbeat timeout).
	SessionTimeout time.Duration
}

// ProgressKind says what a Progress reports.
type ProgressKind int

const (
	// ProgressFormed: every rank is ready and the run starts.
	ProgressFormed ProgressKind = iota
	// ProgressSamples: Done of Total samples of Epoch are trained (at most
	// every 100 ms); Loss is the latest batch loss a rank reported.
	ProgressSamples
	// ProgressEpoch: Epoch finished; Summary describes it.
	ProgressEpoch
	// ProgressMembership: Event changed the cohort.
	ProgressMembership
	// ProgressCheckpoint: Checkpoint is a new complete checkpoint.
	ProgressCheckpoint
	// ProgressModel: the completed run's trained model is kept in Model.
	ProgressModel
)

// Progress is one report of a run's advance.
type Progress struct {
	Kind       ProgressKind
	Epoch      uint64
	Epochs     int
	Done       uint64
	Total      uint64
	Loss       *float64
	Live       int
	World      int
	Summary    *record.EpochSummary
	Event      *record.MembershipEvent
	Checkpoint string
	Model      string
}

// Coordinator runs one training run. Make it with New, then call Run once.
type Coordinator struct {
	opts     Options
	cfg      *config.Config
	log      hclog.Logger
	ln       net.Listener
	tls      *tls.Config // coordinator.tls's server configuration; nil: plain TCP
	out      string
	runID    string
	meetings *meeting.Table
	resume   string
	meta     *checkpoint.Meta
	// comeback is the consensus file of a run whose coordinator died,
	// when this one takes its ranks back (comeback.go).
	comeback *checkpoint.Consensus
	ckpts    *checkpoint.Writer
	snapshot atomic.Pointer[status.Snapshot]

	stopOnce sync.Once
	stopCh   chan struct{}
	ranOnce  sync.Once
}

// New checks the configuration, prepares the out directory, reads the
// checkpoint to resume from and starts listening. Run must follow, or
// Close.
func New(opts Options) (_ *Coordinator, err error) {
	if opts.Config == nil {
		return nil, errors.New("coordinator: no config")
	}
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator: config: %w", err)
	}
	if _, err := opts.Keys.Derive("coordinator"); err != nil {
		return nil, fmt.Errorf("coordinator: keys: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	c := &Coordinator{
		opts:   opts,
		cfg:    cfg,
		log:    log.Named("coordinator"),
		stopCh: make(chan struct{}),
	}
	defer func() {
		if err != nil && opts.Listener != nil {
			opts.Listener.Close()
		}
	}()

	if c.runID, err = newRunID(); err != nil {
		return nil, err
	}
	out := opts.Out
	if out == "" {
		out = cfg.Run.Out
	}
	if out == "" {
		return nil, errors.New("coordinator: no out directory")
	}
	if c.out, err = filepath.Abs(out); err != nil {
		return nil, fmt.Errorf("coordinator: out directory: %w", err)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return nil, fmt.Errorf("coordinator: create out directory: %w", err)
	}

	if cfg.Coordinator.TLS.Enabled() {
		if c.tls, err = cfg.Coordinator.TLS.ServerConfig(); err != nil {
			return nil, fmt.Errorf("coordinator: coordinator.tls: %w", err)
		}
	}
	comeback := false
	if opts.Resume != "" {
		if comeback, err = c.openComeback(opts.Resume); err != nil {
			return nil, fmt.Errorf("coordinator: resume: %w", err)
		}
	}
	if opts.Resume != "" && !comeback {
		if c.resume, err = checkpoint.ResolveCheckpoint(opts.Resume); err != nil {
			return nil, fmt.Errorf("coordinator: %w", err)
		}
		if c.meta, err = checkpoint.ReadMeta(c.resume); err != nil {
			return nil, fmt.Errorf("coordinator: resume: %w", err)
		}
	}
	if c.meta != nil {
		if c.meta.Seed != cfg.Run.Seed {
			return nil, fmt.Errorf("coordinator: resume: checkpoint %s was taken with seed %d, the config has seed %d; the data order would differ",
				c.resume, c.meta.Seed, cfg.Run.Seed)
		}
	}
	c.meetings = meeting.NewTable(meeting.Env{
		Listen:     cfg.Coordinator.Listen,
		ReducePort: cfg.Coordinator.ReducePort,
		TLS:        c.tls,
		Keys:       opts.Keys,
		RunID:      c.runID,
		World:      uint32(cfg.Run.Ranks),
		Logger:     c.log,
	}, opts.Meetings)

	var removed []string
	run := checkpoint.Run{RunID: c.runID, Seed: cfg.Run.Seed, World: uint32(cfg.Run.Ranks), Policy: string(cfg.Coordinator.Policy), Epochs: cfg.Run.Epochs}
	if c.ckpts, removed, err = checkpoint.Open(filepath.Join(c.out, checkpoint.CheckpointsDir), run, cfg.Coordinator.CheckpointKeep, c.log); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	for _, p := range removed {
		c.log.Warn("removed an incomplete checkpoint left by an earlier run", "path", p)
	}

	c.ln = opts.Listener
	if c.ln == nil {
		if c.ln, err = net.Listen("tcp", cfg.Coordinator.Listen); err != nil {
			return nil, fmt.Errorf("coordinator: listen on %s: %w", cfg.Coordinator.Listen, err)
		}
	}
	return c, nil
}

// Addr is the control server's address.
func (c *Coordinator) Addr() net.Addr { return c.ln.Addr() }

// RunID names this run; the ranks learn it from Admit.
func (c *Coordinator) RunID() string { return c.runID }

// Out is the run's output directory (absolute).
func (c *Coordinator) Out() string { return c.out }

// Stop asks the run to stop cleanly: no more dispatch, the plans in flight
// finish, a final round averages them, every rank saves
// (ShutdownWithSave) and the checkpoint is completed; the run ends with
// status "stopped". Before the cohort has formed the run simply ends.
// Stop returns at once and may be called from any goroutine, any number of
// times.
func (c *Coordinator) Stop() {
	c.stopOnce.Do(func() { close(c.stopCh) })
}

// Close releases the listener (and any meeting point) of a Coordinator
// that will not Run.
func (c *Coordinator) Close() error {
	return errors.Join(c.ln.Close(), c.meetings.Close())
}

// Run runs the cohort until the run completes, fails, is stopped, or ctx
// ends (which abandons the run at once: connections close, nothing is
// saved). It writes OUT/summary.json in every case and returns the
// summary; the error is non-nil when the status is "failed", or when the
// summary could not be written.
func (c *Coordinator) Run(ctx context.Context) (*record.Summary, error) {
	ran := false
	c.ranOnce.Do(func() { ran = true })
	if !ran {
		return nil, errors.New("coordinator: Run called twice")
	}
	r := newRunner(c)
	sum, runErr := r.run(ctx)
	// The reduce server's count stands in only where it saw more than the
	// ranks reported (as for the live totals): over one host it counts no
	// ring bytes, while the ranks' averagers still move their rounds'
	// messages over its sockets.
	if rounds, bytes := c.meetings.Bulk(); rounds > 0 && float64(bytes)/float64(rounds) > sum.Averaging.BytesPerRound {
		sum.Averaging.BytesPerRound = float64(bytes) / float64(rounds)
	}
	if err := c.meetings.Close(); err != nil {
		c.log.Warn("closing the meeting points", "error", err)
	}
	if err := record.WriteJSON(filepath.Join(c.out, record.SummaryFile), sum); err != nil {
		c.log.Error("writing the run summary failed", "error", err)
		if runErr == nil {
			runErr = fmt.Errorf("coordinator: %w", err)
		}
	}
	if err := r.rep.WriteCurves(); err != nil {
		c.log.Warn("drawing the run's curves failed", "error", err)
	}
	return sum, runErr
}

// Status is the run's latest published snapshot, for the status server;
// nil before Run starts. It may be called from any goroutine: the loop
// publishes a new immutable snapshot and never waits on a reader.
func (c *Coordinator) Status() *status.Snapshot { return c.snapshot.Load() }

// wireOptions are the options of every rank connection's handshake and
// frames.
func (c *Coordinator) wireOptions() []wire.Option {
	opts := []wire.Option{wire.WithIdleTimeout(c.cfg.Coordinator.HeartbeatTimeout), wire.WithTLS(c.tls)}
	if d := c.opts.HandshakeTimeout; d > 0 {
		opts = append(opts, wire.WithHandshakeTimeout(d))
	}
	return opts
}

// admit is the Admit every rank gets when it joins: what every rank must
// share to train together.
func (c *Coordinator) admit() *wirepb.Admit {
	return &wirepb.Admit{
		RunId:     c.runID,
		Seed:      uint64(c.cfg.Run.Seed),
		ResumeDir: c.resume,
		Comeback:  c.comeback != nil,
		Epochs:    uint64(c.cfg.Run.Epochs),
		// Async rounds run beside training where the trainer can.
		OverlapRounds: c.cfg.Coordinator.Policy == config.PolicyAsync && c.cfg.Coordinator.AsyncOverlap,
	}
}

// sessionTimeout is how long a survivor gets to answer RequestSessionId.
func (c *Coordinator) sessionTimeout() time.Duration {
	if d := c.opts.SessionTimeout; d > 0 {
		return d
	}
	return max(5*time.Second, c.cfg.Coordinator.HeartbeatTimeout)
}

// exitTimeout bounds the wait for Exiting after Shutdown, or for the saves
// and exits after ShutdownWithSave (saving).
func (c *Coordinator) exitTimeout(saving bool) time.Duration {
	if saving {
		if d := c.opts.SaveTimeout; d > 0 {
			return d
		}
		return 5 * time.Minute
	}
	if d := c.opts.ExitTimeout; d > 0 {
		return d
	}
	return 30 * time.Second
}

func newRunID() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("coordinator: make run id: %w", err)
	}
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:]), nil
}
