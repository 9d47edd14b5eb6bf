package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// rankSpec is what every simulated rank of a run shares.
type rankSpec struct {
	addr      string
	keys      wire.Keys
	world     uint32
	samples   uint64 // the data set's size, in Ready
	batch     uint32
	batchTime time.Duration // each batch "trains" this long
	heartbeat time.Duration // the Heartbeat cadence
}

// killKind is how a rank is killed.
type killKind int

const (
	killClose  killKind = iota + 1 // the connection closes abruptly
	killSilent                     // the rank stops sending, heartbeats too, and keeps its connection
)

func (k killKind) String() string {
	if k == killSilent {
		return "silent"
	}
	return "close"
}

// simRank is one rank speaking the real control protocol as a worker does,
// with a trainer that sleeps per batch and an averager whose rounds succeed
// at once unless a death aborted them: plans in order (extensions ahead of
// queued plans, plans that came with a Sync held until its round succeeds),
// membership frames (DeclareDead, NewSession, RequestSessionId) at once,
// Heartbeat every spec.heartbeat, Exiting on Shutdown.
type simRank struct {
	spec *rankSpec
	id   uint32
	rec  *recorder

	killOnce sync.Once
	killed   chan struct{} // closed by kill
	kind     killKind

	mu      sync.Mutex
	conn    *wire.Conn // nil until the handshake succeeds
	aborted bool       // a peer died since the group last re-formed
	session *wirepb.NewSession
}

func newSimRank(spec *rankSpec, id uint32, rec *recorder) *simRank {
	return &simRank{spec: spec, id: id, rec: rec, killed: make(chan struct{})}
}

// kill makes the rank die the given way; the first call counts.
func (s *simRank) kill(kind killKind) {
	s.killOnce.Do(func() {
		s.kind = kind
		s.rec.killedAt(s.id, kind)
		close(s.killed)
		s.mu.Lock()
		conn := s.conn
		s.mu.Unlock()
		if kind == killClose && conn != nil {
			conn.Close()
		}
	})
}

func (s *simRank) isKilled() bool {
	select {
	case <-s.killed:
		return true
	default:
		return false
	}
}

// run connects and plays the rank until the coordinator lets it go, the
// rank is killed, or ctx ends. A killed rank's error is not an error.
func (s *simRank) run(ctx context.Context) error {
	err := s.play(ctx)
	if s.isKilled() {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", s.id, err)
	}
	return nil
}

func (s *simRank) play(ctx context.Context) error {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", s.spec.addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", s.spec.addr, err)
	}
	conn, err := wire.ClientHandshake(ctx, nc, s.spec.keys, wire.Hello{Rank: s.id, World: s.spec.world})
	if err != nil {
		return fmt.Errorf("handshake with %s: %w", s.spec.addr, err)
	}
	s.mu.Lock()
	s.conn = conn
	s.mu.Unlock()
	if s.isKilled() {
		conn.Close() // killed during the handshake
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		conn.Close()
		wg.Wait()
	}()
	// A silent rank sends nothing more; a closed one cannot.
	send := func(m proto.Message) error {
		if s.isKilled() {
			return nil
		}
		return conn.Send(ctx, m)
	}

	wg.Add(1)
	go func() {
		defer wg.Done()
		s.heartbeats(ctx, send)
	}()
	cmds := make(chan proto.Message, 1024)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(cmds)
		s.read(ctx, conn, send, cmds)
	}()
	return s.work(ctx, send, cmds)
}

func (s *simRank) heartbeats(ctx context.Context, send func(proto.Message) error) {
	t := time.NewTicker(s.spec.heartbeat)
	defer t.Stop()
	for n := uint64(0); ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-s.killed:
			return
		case <-t.C:
			if send(&wirepb.Heartbeat{Rank: s.id, Counter: n}) != nil {
				return
			}
		}
	}
}

// read is the rank's bridge: membership frames are handled at once, the
// rest queued in order for work. A silent rank's frames are read and
// dropped, as a hung process's kernel would buffer them.
func (s *simRank) read(ctx context.Context, conn *wire.Conn, send func(proto.Message) error, cmds chan<- proto.Message) {
	for {
		m, err := conn.Receive(ctx)
		if err != nil {
			return
		}
		if s.isKilled() {
			continue
		}
		now := time.Now()
		switch v := m.(type) {
		case *wirepb.DeclareDead:
			s.rec.declaredAt(v.GetRank(), now)
			s.mu.Lock()
			s.aborted = true
			s.mu.Unlock()
		case *wirepb.NewSession:
			s.mu.Lock()
			s.session = v
			s.mu.Unlock()
		case *wirepb.RequestSessionId:
			send(&wirepb.SessionIdGenerated{Rank: s.id, Generation: v.GetGeneration(),
				SessionId: fmt.Appendf(nil, "session-%d-from-%d", v.GetGeneration(), s.id)})
		case *wirepb.SetEpochCallbackRole:
			s.rec.formed(now)
		case *wirepb.CoordinatorHeartbeat, *wirepb.Meeting, *wirepb.RelayResult, *wirepb.SetGlobalStep:
		default:
			if u, ok := m.(*wirepb.Update); ok {
				s.rec.roundDone(u.GetVersion(), now)
			}
			if y, ok := m.(*wirepb.Sync); ok {
				s.rec.roundIssued(y.GetRound(), now)
			}
			select {
			case cmds <- m:
			case <-ctx.Done():
				return
			}
		}
	}
}

// plan is one plan the rank holds.
type plan struct {
	ext bool
	p   *wirepb.EpochPlan
}

// work runs the rank's commands and plans in order, as a worker's queue
// does.
func (s *simRank) work(ctx context.Context, send func(proto.Message) error, cmds <-chan proto.Message) error {
	var pending []plan
	var held []*wirepb.EpochPlan
	steps := uint64(0)
	for {
		if s.isKilled() {
			// Dead: whatever still arrives goes unanswered until the
			// coordinator gives up on the link.
			for range cmds {
			}
			return nil
		}
		var m proto.Message
		var ok bool
		select {
		case m, ok = <-cmds:
		default:
			if len(pending) > 0 {
				p := pending[0]
				pending = pending[1:]
				if err := s.train(ctx, send, p.p, &steps); err != nil {
					return err
				}
				continue
			}
			select {
			case m, ok = <-cmds:
			case <-s.killed:
				continue
			}
		}
		if !ok {
			if s.isKilled() {
				return nil
			}
			return errors.New("link closed by the coordinator before Shutdown")
		}
		var err error
		switch v := m.(type) {
		case *wirepb.Admit:
			// An averager that meets through the relay exchanges a blob
			// with every peer (an address, a communicator id) before Ready.
			err = send(&wirepb.MeetRequest{Kind: "relay", Averager: "scale"})
			if err == nil {
				err = send(&wirepb.RelayPost{Key: "scale/setup", Blob: fmt.Appendf(nil, "rank-%d", s.id)})
			}
			if err == nil {
				err = send(&wirepb.Ready{Rank: s.id, Samples: s.spec.samples, EvalSamples: 32, LayoutDigest: []byte("scale-layout"),
					BatchSize: s.spec.batch, Trainer: "scale", Averager: "scale"})
			}
		case *wirepb.StartEpoch:
			pending = append(pending, plan{p: v.GetPlan()})
		case *wirepb.Update:
			if p := v.GetNextPlan(); p != nil {
				pending = append(pending, plan{p: p})
			}
		case *wirepb.ExtendPartition:
			at := 0
			for at < len(pending) && pending[at].ext {
				at++
			}
			pending = slices.Insert(pending, at, plan{ext: true, p: &wirepb.EpochPlan{
				Epoch: v.GetEpoch(), PartitionOffset: v.GetPartitionOffset(), PartitionSize: v.GetPartitionSize()}})
		case *wirepb.Sync:
			if p := v.GetNextPlan(); p != nil {
				held = append(held, p)
			}
			var done bool
			if done, err = s.sync(send, v); done {
				for _, p := range held {
					pending = append(pending, plan{p: p})
				}
				held = nil
			}
		case *wirepb.Evaluate:
			acc := 0.5
			err = send(&wirepb.EvalResult{Rank: s.id, ScheduleId: v.GetScheduleId(), Epoch: v.GetEpoch(), Loss: 0.5, Accuracy: &acc})
		case *wirepb.Checkpoint:
			err = send(&wirepb.CheckpointResult{Rank: s.id, Version: v.GetVersion(), Error: "the scale harness keeps no state"})
		case *wirepb.Shutdown, *wirepb.ShutdownWithSave:
			s.rec.exited()
			return send(&wirepb.Exiting{Rank: s.id})
		}
		if err != nil {
			return err
		}
	}
}

// train sleeps through each batch of p and reports it, then closes the
// plan with Metrics.
func (s *simRank) train(ctx context.Context, send func(proto.Message) error, p *wirepb.EpochPlan, steps *uint64) error {
	t := time.NewTimer(s.spec.batchTime)
	defer t.Stop()
	start := time.Now()
	var batches uint64
	size := p.GetPartitionSize()
	for done := uint64(0); done < size; {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.killed:
			return nil
		}
		t.Reset(s.spec.batchTime)
		n := min(uint64(s.spec.batch), size-done)
		done += n
		batches++
		*steps++
		err := send(&wirepb.Batch{Rank: s.id, Epoch: p.GetEpoch(), BatchMs: plugin.Milliseconds(s.spec.batchTime), Samples: uint32(n),
			StepCount: *steps, BatchLoss: 0.5, PartitionOffset: p.GetPartitionOffset(), PartitionSize: size})
		if err != nil {
			return err
		}
	}
	return send(&wirepb.Metrics{Rank: s.id, Epoch: p.GetEpoch(), AvgLoss: 0.5, Batches: batches, Samples: size,
		EpochMs: plugin.Milliseconds(time.Since(start)), PartitionOffset: p.GetPartitionOffset(), PartitionSize: size})
}

// sync plays one round: a NewSession received since the last round
// re-forms the group first; a round after a death and before that is
// aborted, as the averager's watchdog would abort it. done reports a round
// that succeeded.
func (s *simRank) sync(send func(proto.Message) error, v *wirepb.Sync) (done bool, err error) {
	s.mu.Lock()
	if s.session != nil {
		s.session, s.aborted = nil, false
	}
	aborted := s.aborted
	s.mu.Unlock()
	if err := send(&wirepb.SnapshotReady{Rank: s.id, Round: v.GetRound()}); err != nil {
		return false, err
	}
	return !aborted, send(&wirepb.SyncAck{Rank: s.id, Round: v.GetRound(), Aborted: aborted, BytesMoved: 64, RoundMs: 0.1})
}
