package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugintest"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// This file holds the scripted ranks the coordinator's tests run against:
// each speaks the real handshake and frames, and behaves like a worker
// (plans in order, Sync between plans, membership frames at the bridge),
// training nothing but sleeping per batch and recording which positions of
// each epoch's permutation it trained.

// ledger records trained permutation positions per epoch, from every rank.
type ledger struct {
	mu   sync.Mutex
	seen map[uint64]map[uint64][]training // epoch -> position -> its trainings
}

// training is one rank's training of a position, after it had completed
// rounds averaging rounds.
type training struct {
	f      *fakeRank
	rounds int
}

func newLedger() *ledger { return &ledger{seen: map[uint64]map[uint64][]training{}} }

func (l *ledger) add(f *fakeRank, rounds int, epoch, from, n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.seen[epoch]
	if m == nil {
		m = map[uint64][]training{}
		l.seen[epoch] = m
	}
	for p := from; p < from+n; p++ {
		m[p] = append(m[p], training{f, rounds})
	}
}

// lostWithRank reports whether tr died with its rank: the rank left the
// run without a clean exit, and trained it after the last round it
// completed, so no round carried it into the cohort's model.
func lostWithRank(tr training) bool {
	tr.f.mu.Lock()
	defer tr.f.mu.Unlock()
	return !tr.f.exitedOK && tr.rounds >= tr.f.roundsDone
}

// checkExactlyOnce fails t unless every position of every epoch below
// epochs is in the cohort's model exactly once: trained once, not
// counting trainings lost with their rank, which must have been trained
// again.
func (l *ledger) checkExactlyOnce(t *testing.T, epochs, pickSpace uint64) {
	t.Helper()
	l.checkEpochs(t, 0, epochs, pickSpace)
}

// checkEpochs is checkExactlyOnce for epochs from..to-1; nothing of any
// other epoch may have been trained.
func (l *ledger) checkEpochs(t *testing.T, from, to, pickSpace uint64) {
	t.Helper()
	l.checkHeld(t, from, to, pickSpace, lostWithRank)
}

// checkHeld is checkEpochs with lost saying which trainings the cohort's
// model does not hold.
func (l *ledger) checkHeld(t *testing.T, from, to, pickSpace uint64, lost func(training) bool) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for e, m := range l.seen {
		if (e < from || e >= to) && len(m) > 0 {
			t.Errorf("epoch %d: %d positions trained, want none", e, len(m))
		}
	}
	for e := from; e < to; e++ {
		m := l.seen[e]
		var missing, twice []uint64
		for p := range pickSpace {
			n := 0
			for _, tr := range m[p] {
				if !lost(tr) {
					n++
				}
			}
			switch {
			case n == 0:
				missing = append(missing, p)
			case n > 1:
				twice = append(twice, p)
			}
		}
		if len(missing) > 0 || len(twice) > 0 || uint64(len(m)) != pickSpace {
			t.Errorf("epoch %d: %d positions not held (first %v), %d held more than once (first %v), %d distinct of %d",
				e, len(missing), head(missing), len(twice), head(twice), len(m), pickSpace)
		}
	}
}

func head(s []uint64) []uint64 { return s[:min(len(s), 5)] }

// fakeGroup stands in for the averager's collective: a round completes for
// a rank when every member of its session has entered it, and fails when
// the rank's averager is aborted first.
type fakeGroup struct {
	mu      sync.Mutex
	cond    *sync.Cond
	arrived map[uint64]map[uint32]bool
}

func newFakeGroup() *fakeGroup {
	g := &fakeGroup{arrived: map[uint64]map[uint32]bool{}}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *fakeGroup) arrive(round uint64, rank uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.arrived[round] == nil {
		g.arrived[round] = map[uint32]bool{}
	}
	g.arrived[round][rank] = true
	g.cond.Broadcast()
}

// wait blocks until every member has arrived at round (true) or aborted()
// holds or ctx ends (false).
func (g *fakeGroup) wait(ctx context.Context, round uint64, members []uint32, aborted func() bool) bool {
	stop := context.AfterFunc(ctx, g.poke)
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		all := true
		for _, m := range members {
			all = all && g.arrived[round][m]
		}
		if all {
			return true
		}
		if aborted() || ctx.Err() != nil {
			return false
		}
		g.cond.Wait()
	}
}

func (g *fakeGroup) poke() {
	g.mu.Lock()
	g.cond.Broadcast()
	g.mu.Unlock()
}

// rankScript is how a scripted rank behaves.
type rankScript struct {
	msPerBatch time.Duration
	adaptive   bool   // Ready says the trainer's optimizer is adaptive
	batch      uint32 // default 8
	samples    uint64 // default 96
	digest     []byte // default "model-a"
	world      uint32 // hello's world size; default the harness's
	// dieAfterBatches > 0: the connection drops after that many batches.
	dieAfterBatches int
	// silentAfterBatches > 0: after that many batches the rank stops
	// sending anything (heartbeats too) but keeps its connection.
	silentAfterBatches int
	// dieOnRoundSet: on Sync of round dieOnRound the rank drops its
	// connection; enterFirst makes it enter the collective first and wait
	// until every member has.
	dieOnRound    uint64
	dieOnRoundSet bool
	enterFirst    bool
	// abortRound: on Sync of that round, enter the collective but wait for
	// DeclareDead and ack aborted.
	abortRound    uint64
	abortRoundSet bool
	// exitAfterBatches > 0: after that many batches the rank sends Exiting
	// and closes, as a worker told to stop would.
	exitAfterBatches int
	// junk makes the rank send frames the coordinator must shrug off:
	// duplicates, answers to questions never asked, NaN figures.
	junk bool
	// failSave makes Checkpoint and ShutdownWithSave report an error.
	failSave bool
	// noHeartbeat turns the heartbeat goroutine off.
	noHeartbeat bool
	// solo: Ready says the averager's lone round is the identity.
	solo bool
	// noEval: Ready says the trainer has no test split.
	noEval bool
	// anonymousReports: Batch frames do not name their plan.
	anonymousReports bool
	// ignoreShutdown: Shutdown and ShutdownWithSave go unanswered while the
	// rank keeps its connection and heartbeats, as a hung worker would.
	ignoreShutdown bool
	// ignoreSessionRequest: RequestSessionId goes unanswered.
	ignoreSessionRequest bool
	// meet, when set, is the meeting kind the rank asks for after Admit;
	// relayKeys are relay exchanges it posts to (blob "<key>@<rank>")
	// after Admit. The answers are recorded; Ready follows at once.
	meet      string
	relayKeys []string
	// restartAfterBatches > 0: after that many batches the rank reports
	// that it replaced its trainer, with no plan lost.
	restartAfterBatches int
	// divergence, when set, is the divergence the rank reports for each
	// completed round (with weight 1).
	divergence func(round uint64) float64
	// epochFn > 0: while the rank holds the eval role, it spends this long
	// before its first plan of each epoch, as a worker's epoch callback
	// does, and reports it in EpochFnElapsed.
	epochFn time.Duration
	// scalars, when set, are a plan's Metrics.scalars for its batches.
	scalars func(batches uint64) map[string]*wirepb.ScalarSum
}

// planRec is one plan a rank received.
type planRec struct {
	via    string // "start", "update", "ext"
	epoch  uint64
	offset uint64
	size   uint64
	window int // rounds completed on this rank before it ran
	// queued is how many commands waited behind the plan when it finished.
	queued int
	// merged: the plan let its Batch reports merge, and they did.
	merged bool
}

// fakeRank is one scripted rank.
type fakeRank struct {
	h      *harness
	id     uint32
	script rankScript

	mu         sync.Mutex
	plans      []planRec
	received   []proto.Message
	members    []uint32
	pending    *wirepb.NewSession
	aborted    bool
	deadPeers  []uint32
	roundsDone int
	steps      uint64
	exitedOK   bool
	err        error
	admit      *wirepb.Admit
	gotDeclare chan struct{}
}

func (f *fakeRank) record(m proto.Message) {
	f.mu.Lock()
	f.received = append(f.received, m)
	f.mu.Unlock()
}

// messages returns what the rank received, in order, of type T.
func messagesOf[T proto.Message](f *fakeRank) []T {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []T
	for _, m := range f.received {
		if v, ok := m.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func (f *fakeRank) isAborted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.aborted
}

// run connects and plays the rank until the coordinator lets it go or
// ctx ends.
func (f *fakeRank) run(ctx context.Context) {
	err := f.play(ctx)
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakeRank) play(ctx context.Context) error {
	s := f.script
	world := s.world
	if world == 0 {
		world = f.h.world
	}
	nc, err := net.Dial("tcp", f.h.addr)
	if err != nil {
		return err
	}
	conn, err := wire.ClientHandshake(ctx, nc, f.h.keys, wire.Hello{Rank: f.id, World: world})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		conn.Close()
		wg.Wait()
	}()
	var silent sync.Once
	quiet := make(chan struct{})
	beQuiet := func() { silent.Do(func() { close(quiet) }) }

	send := func(m proto.Message) error {
		select {
		case <-quiet:
			return nil
		default:
		}
		return conn.Send(ctx, m)
	}
	if !s.noHeartbeat {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for n := uint64(0); ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-quiet:
					return
				case <-t.C:
					send(&wirepb.Heartbeat{Rank: f.id, Counter: n})
				}
			}
		}()
	}

	// The bridge: membership frames at once, the rest queued in order.
	cmds := make(chan proto.Message, 4096)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(cmds)
		for {
			m, err := conn.Receive(ctx)
			if err != nil {
				return
			}
			f.record(m)
			switch v := m.(type) {
			case *wirepb.DeclareDead:
				f.mu.Lock()
				f.aborted = true
				f.deadPeers = append(f.deadPeers, v.GetRank())
				f.mu.Unlock()
				select {
				case f.gotDeclare <- struct{}{}:
				default:
				}
				f.h.group.poke()
			case *wirepb.NewSession:
				f.mu.Lock()
				f.pending = v
				f.mu.Unlock()
			case *wirepb.RequestSessionId:
				if f.script.ignoreSessionRequest {
					continue
				}
				send(&wirepb.SessionIdGenerated{Rank: f.id, Generation: v.GetGeneration(), SessionId: []byte(fmt.Sprintf("session-%d-from-%d", v.GetGeneration(), f.id))})
			case *wirepb.CoordinatorHeartbeat, *wirepb.Meeting, *wirepb.RelayResult:
			default:
				cmds <- m
			}
		}
	}()

	batch := uint64(s.batch)
	if batch == 0 {
		batch = 8
	}
	samples := s.samples
	if samples == 0 {
		samples = 96
	}
	digest := s.digest
	if digest == nil {
		digest = []byte("model-a")
	}
	f.mu.Lock()
	f.members = nil
	for i := range f.h.world {
		f.members = append(f.members, i)
	}
	f.mu.Unlock()
	batches := 0

	sendJunk := func(extra ...proto.Message) error {
		nan := math.NaN()
		for _, m := range append(extra,
			&wirepb.SyncAck{Rank: 99, Round: 99},
			&wirepb.Metrics{Rank: f.id, Epoch: 7, PartitionOffset: 1, PartitionSize: 1 << 60, AvgLoss: nan},
			&wirepb.Batch{Rank: f.id, Epoch: 3, BatchMs: nan, Samples: 1},
			&wirepb.EvalResult{Rank: f.id, ScheduleId: 42, Loss: nan},
			&wirepb.CheckpointResult{Rank: f.id, Version: 9},
			&wirepb.SessionIdGenerated{Rank: f.id, Generation: 5},
		) {
			if err := send(m); err != nil {
				return err
			}
		}
		return nil
	}
	junkSent := false

	var queuedPlans func() int // plans waiting in the rank's own queue

	holder := uint32(math.MaxUint32) // the eval role's rank, from SetEpochCallbackRole
	var fired *uint64                // the last epoch whose first plan ran
	epochFn := func(epoch uint64) error {
		if fired != nil && *fired == epoch {
			return nil
		}
		fired = &epoch
		if s.epochFn == 0 || holder != f.id {
			return nil
		}
		select {
		case <-time.After(s.epochFn):
		case <-ctx.Done():
			return ctx.Err()
		}
		return send(&wirepb.EpochFnElapsed{Rank: f.id, Epoch: epoch, ElapsedMs: float64(s.epochFn) / 1e6})
	}
	// trainPlan trains a plan; with merge, its batches go in one Batch
	// frame before its Metrics, as a worker merges a solo plan's reports.
	trainPlan := func(via string, epoch, off, size uint64, merge bool) error {
		if err := epochFn(epoch); err != nil {
			return err
		}
		f.mu.Lock()
		f.plans = append(f.plans, planRec{via: via, epoch: epoch, offset: off, size: size, window: f.roundsDone})
		f.mu.Unlock()
		start := time.Now()
		var nb uint64
		merged := &wirepb.Batch{Rank: f.id, Epoch: epoch, BatchLoss: 0.5, PartitionOffset: off, PartitionSize: size}
		for done := uint64(0); done < size; {
			n := min(batch, size-done)
			select {
			case <-time.After(s.msPerBatch):
			case <-ctx.Done():
				return ctx.Err()
			}
			select {
			case <-quiet:
				<-ctx.Done()
				return ctx.Err()
			default:
			}
			f.mu.Lock()
			rounds := f.roundsDone
			f.mu.Unlock()
			f.h.ledger.add(f, rounds, epoch, off+done, n)
			done += n
			nb++
			batches++
			f.mu.Lock()
			f.steps++
			f.mu.Unlock()
			b := &wirepb.Batch{Rank: f.id, Epoch: epoch, BatchMs: float64(s.msPerBatch) / 1e6, Samples: uint32(n), StepCount: uint64(batches), BatchLoss: 0.5}
			if !s.anonymousReports {
				b.PartitionOffset, b.PartitionSize = off, size
			}
			if merge {
				merged.Batches++
				merged.BatchMs += b.BatchMs
				merged.Samples += b.Samples
				merged.StepCount = b.StepCount
			} else if err := send(b); err != nil {
				return err
			}
			if s.restartAfterBatches > 0 && batches == s.restartAfterBatches {
				if err := send(&wirepb.PluginRestarted{Rank: f.id, Kind: "trainer", Reason: "scripted", Restarts: 1}); err != nil {
					return err
				}
			}
			if s.dieAfterBatches > 0 && batches >= s.dieAfterBatches {
				return errors.New("scripted death")
			}
			if s.exitAfterBatches > 0 && batches >= s.exitAfterBatches {
				send(&wirepb.Exiting{Rank: f.id})
				return errors.New("scripted exit")
			}
			if s.silentAfterBatches > 0 && batches >= s.silentAfterBatches {
				beQuiet()
			}
		}
		f.mu.Lock()
		f.plans[len(f.plans)-1].queued = len(cmds) + queuedPlans()
		f.plans[len(f.plans)-1].merged = merge
		f.mu.Unlock()
		if merge && merged.Batches > 0 {
			if err := send(merged); err != nil {
				return err
			}
		}
		loss := 0.5
		if s.junk {
			loss = math.Inf(1)
		}
		m := &wirepb.Metrics{Rank: f.id, Epoch: epoch, AvgLoss: loss, Batches: nb, Samples: size,
			EpochMs: float64(time.Since(start)) / 1e6, PartitionOffset: off, PartitionSize: size}
		if s.scalars != nil {
			m.Scalars = s.scalars(nb)
		}
		err := send(m)
		if err == nil && s.junk && !junkSent {
			junkSent = true
			err = sendJunk()
		}
		return err
	}

	save := func(dir string, version uint64) error {
		res := &wirepb.CheckpointResult{Rank: f.id, Version: version}
		if s.failSave {
			res.Error = "scripted save failure"
		} else if err := os.WriteFile(filepath.Join(dir, "state.json"), fmt.Appendf(nil, `{"rank":%d,"steps":%d}`, f.id, f.steps), 0o644); err != nil {
			res.Error = err.Error()
		}
		return send(res)
	}

	// Plans queue as a worker's do: extensions ahead of queued plans (after
	// earlier extensions), plans that came with a Sync held until a round
	// succeeds, and every queued command handled before the next plan.
	type queued struct {
		via string
		p   *wirepb.EpochPlan
	}
	var pending []queued
	var held []*wirepb.EpochPlan
	queuedPlans = func() int { return len(pending) }
	next := func() (proto.Message, bool) {
		for {
			select {
			case m, ok := <-cmds:
				return m, ok
			default:
			}
			if len(pending) == 0 {
				m, ok := <-cmds
				return m, ok
			}
			q := pending[0]
			pending = pending[1:]
			if err := trainPlan(q.via, q.p.GetEpoch(), q.p.GetPartitionOffset(), q.p.GetPartitionSize(), q.p.GetReportIntervalMs() > 0); err != nil {
				f.mu.Lock()
				f.err = err
				f.mu.Unlock()
				return nil, false
			}
		}
	}
	for {
		m, ok := next()
		if !ok {
			break
		}
		var err error
		switch v := m.(type) {
		case *wirepb.Admit:
			f.mu.Lock()
			f.admit = v
			f.mu.Unlock()
			if s.meet != "" {
				if err := send(&wirepb.MeetRequest{Kind: s.meet, Averager: "scripted"}); err != nil {
					return err
				}
			}
			for _, key := range s.relayKeys {
				if err := send(&wirepb.RelayPost{Key: key, Blob: []byte(fmt.Sprintf("%s@%d", key, f.id))}); err != nil {
					return err
				}
			}
			ready := &wirepb.Ready{Rank: f.id, Samples: samples, EvalSamples: 32, LayoutDigest: digest, BatchSize: uint32(batch),
				Trainer: "scripted", Averager: "scripted", SoloIdentity: s.solo, AdaptiveOptimizer: s.adaptive}
			if s.noEval {
				ready.EvalSamples = 0
			}
			err = send(ready)
			if s.junk && err == nil {
				err = sendJunk(ready)
			}
		case *wirepb.StartEpoch:
			pending = append(pending, queued{"start", v.GetPlan()})
		case *wirepb.Update:
			if p := v.GetNextPlan(); p != nil {
				pending = append(pending, queued{"update", p})
			}
		case *wirepb.ExtendPartition:
			at := 0
			for at < len(pending) && pending[at].via == "ext" {
				at++
			}
			pending = slices.Insert(pending, at, queued{"ext", &wirepb.EpochPlan{
				Epoch: v.GetEpoch(), PartitionOffset: v.GetPartitionOffset(), PartitionSize: v.GetPartitionSize()}})
		case *wirepb.Sync:
			if p := v.GetNextPlan(); p != nil {
				held = append(held, p)
			}
			var done bool
			if done, err = f.syncRound(ctx, v, send, conn); done {
				for _, p := range held {
					pending = append(pending, queued{"sync", p})
				}
				held = nil
			}
		case *wirepb.SetEpochCallbackRole:
			holder = v.GetRank()
		case *wirepb.Evaluate:
			acc := 0.75
			err = send(&wirepb.EvalResult{Rank: f.id, ScheduleId: v.GetScheduleId(), Epoch: v.GetEpoch(), Loss: 0.25, Accuracy: &acc})
		case *wirepb.Checkpoint:
			err = save(v.GetDir(), v.GetVersion())
		case *wirepb.ShutdownWithSave:
			if f.script.ignoreShutdown {
				break
			}
			dir := filepath.Join(v.GetDir(), fmt.Sprintf("rank-%d", f.id))
			if err = os.MkdirAll(dir, 0o755); err == nil {
				err = save(dir, v.GetVersion())
			}
			if err == nil {
				err = send(&wirepb.Exiting{Rank: f.id})
			}
			f.mu.Lock()
			f.exitedOK = err == nil
			f.mu.Unlock()
			return err
		case *wirepb.Shutdown:
			if f.script.ignoreShutdown {
				break
			}
			err = send(&wirepb.Exiting{Rank: f.id})
			f.mu.Lock()
			f.exitedOK = err == nil
			f.mu.Unlock()
			return err
		}
		if err != nil {
			return err
		}
	}
	f.mu.Lock()
	err = f.err
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return errors.New("link closed by the coordinator")
}

// syncRound plays one averaging round: apply a pending NewSession, enter
// the collective, wait for every member, ack; done reports a round that
// succeeded.
func (f *fakeRank) syncRound(ctx context.Context, v *wirepb.Sync, send func(proto.Message) error, conn *wire.Conn) (done bool, err error) {
	s := f.script
	f.mu.Lock()
	if f.pending != nil {
		f.members = slices.Clone(f.pending.GetMembers())
		f.pending = nil
		f.aborted = false
	}
	members := slices.Clone(f.members)
	f.mu.Unlock()
	if s.dieOnRoundSet && v.GetRound() == s.dieOnRound {
		if s.enterFirst {
			// Enter, and die only once every member is in: its
			// contribution is there, so a peer can complete the round.
			f.h.group.arrive(v.GetRound(), f.id)
			f.h.group.wait(ctx, v.GetRound(), members, func() bool { return false })
		}
		conn.Close()
		return false, errors.New("scripted death in a round")
	}
	send(&wirepb.SnapshotReady{Rank: f.id, Round: v.GetRound()})
	start := time.Now()
	ack := &wirepb.SyncAck{Rank: f.id, Round: v.GetRound(), BytesMoved: 100, HostCopyBytes: 7}
	if s.abortRoundSet && v.GetRound() == s.abortRound {
		f.h.group.arrive(v.GetRound(), f.id)
		select {
		case <-f.gotDeclare:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		ack.Aborted = true
	} else if f.isAborted() {
		ack.Aborted = true
	} else {
		f.h.group.arrive(v.GetRound(), f.id)
		if !f.h.group.wait(ctx, v.GetRound(), members, f.isAborted) {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			ack.Aborted = true
		}
	}
	ack.RoundMs = float64(time.Since(start)) / 1e6
	if s.divergence != nil && !ack.Aborted {
		d := s.divergence(v.GetRound())
		ack.Divergence, ack.Weight = &d, 1
	}
	if !ack.Aborted {
		f.mu.Lock()
		f.roundsDone++
		f.mu.Unlock()
	}
	return !ack.Aborted, send(ack)
}

// harness runs a real Coordinator on a loopback port against fake ranks.
type harness struct {
	t      *testing.T
	cfg    *config.Config
	keys   wire.Keys
	world  uint32
	coord  *Coordinator
	addr   string
	out    string
	logs   *plugintest.LogBuffer
	group  *fakeGroup
	ledger *ledger
	ranks  []*fakeRank
	opts   Options

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	sum    *record.Summary
	err    error
}

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// testConfig is a small, fast run: 3 ranks, 2 epochs, sync every 2
// batches, a 2 s heartbeat timeout.
func testConfig(t *testing.T) *config.Config {
	cfg := config.Default()
	cfg.Run.Ranks = 3
	cfg.Run.Epochs = 2
	cfg.Run.Seed = 7
	cfg.Run.Out = t.TempDir()
	cfg.Coordinator.Listen = "127.0.0.1:0"
	cfg.Coordinator.HeartbeatTimeout = 2 * time.Second
	cfg.Coordinator.FormationTimeout = 10 * time.Second
	cfg.Coordinator.SyncEvery = 2
	// Tests that count a rank's frames see no checkpoints unless they ask.
	cfg.Coordinator.CheckpointEvery = 0
	cfg.Averager = config.Plugin{Name: "mock", Settings: json.RawMessage(`{}`)}
	cfg.Trainer = config.Plugin{Name: "mock", Settings: json.RawMessage(`{}`)}
	return cfg
}

func newHarness(t *testing.T, cfg *config.Config, mutate func(*Options)) *harness {
	t.Helper()
	keys, err := wire.DeriveKeys(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, cfg: cfg, keys: keys, world: uint32(cfg.Run.Ranks), logs: &plugintest.LogBuffer{},
		group: newFakeGroup(), ledger: newLedger(), done: make(chan struct{})}
	h.opts = Options{
		Config:      cfg,
		Keys:        keys,
		Logger:      hclog.New(&hclog.LoggerOptions{Output: h.logs, Level: hclog.Debug}),
		ExitTimeout: 5 * time.Second,
		SaveTimeout: 10 * time.Second,
	}
	if mutate != nil {
		mutate(&h.opts)
	}
	h.coord, err = New(h.opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.addr = h.coord.Addr().String()
	h.out = h.coord.Out()
	h.ctx, h.cancel = context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(func() {
		h.cancel()
		h.wg.Wait()
		if t.Failed() {
			t.Logf("coordinator log:\n%s", h.logs.String())
		}
	})
	return h
}

// start runs the coordinator.
func (h *harness) start() {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(h.done)
		h.sum, h.err = h.coord.Run(h.ctx)
	}()
}

// rank starts scripted rank id.
func (h *harness) rank(id uint32, s rankScript) *fakeRank {
	f := &fakeRank{h: h, id: id, script: s, gotDeclare: make(chan struct{}, 16)}
	h.ranks = append(h.ranks, f)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f.run(h.ctx)
	}()
	return f
}

// startAll starts the coordinator and one scripted rank per rank, with
// script(r) saying how rank r behaves.
func (h *harness) startAll(script func(r uint32) rankScript) []*fakeRank {
	h.start()
	var out []*fakeRank
	for r := range h.world {
		var s rankScript
		if script != nil {
			s = script(r)
		}
		out = append(out, h.rank(r, s))
	}
	return out
}

// wait returns the run's outcome.
func (h *harness) wait() (*record.Summary, error) {
	h.t.Helper()
	select {
	case <-h.done:
	case <-time.After(45 * time.Second):
		h.t.Fatalf("the run did not end in time; log:\n%s", h.logs.String())
	}
	return h.sum, h.err
}

// mustComplete waits and fails the test unless the run completed.
func (h *harness) mustComplete() *record.Summary {
	h.t.Helper()
	sum, err := h.wait()
	if err != nil || sum == nil || sum.Status != record.StatusCompleted {
		h.t.Fatalf("run did not complete: status %v, error %v", statusOf(sum), err)
	}
	return sum
}

func statusOf(s *record.Summary) string {
	if s == nil {
		return "<no summary>"
	}
	return s.Status
}

// logHas reports whether the coordinator logged all the substrings on one
// line.
func (h *harness) logHas(subs ...string) bool {
	for line := range strings.SplitSeq(h.logs.String(), "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			return true
		}
	}
	return false
}
