package worker_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// The tests script the coordinator's side of docs/protocol.md by hand: a
// listener, core/wire's ServerHandshake, and frames sent and expected one by
// one.

var testSecret = []byte("0123456789abcdef-worker-test-secret")

// frameWait bounds how long a test waits for a frame it expects.
const frameWait = 10 * time.Second

// testLogger discards logs unless COHORT_TEST_LOG is set (the workers'
// goroutines may log after a test's t.Log is gone).
func testLogger() hclog.Logger {
	if os.Getenv("COHORT_TEST_LOG") == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Trace, Output: os.Stderr})
}

type coordinator struct {
	t     *testing.T
	ln    net.Listener
	keys  wire.Keys
	relay *testRelay
}

func newCoordinator(t *testing.T) *coordinator {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	keys, err := wire.DeriveKeys(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return &coordinator{t: t, ln: ln, keys: keys, relay: &testRelay{links: map[uint32]*link{}, posts: map[string]map[uint32][]byte{}}}
}

func (c *coordinator) addr() string { return c.ln.Addr().String() }

// link is the coordinator's end of one rank's connection. A reader
// goroutine moves frames into a channel, so expectations can time out.
type link struct {
	t      *testing.T
	rank   uint32
	conn   *wire.Conn
	raw    *net.TCPConn
	frames chan proto.Message
	done   chan struct{} // closed when the reader stops (the rank closed)
	relay  *testRelay
	seen   []proto.Message
}

// accept takes one rank's connection, runs the handshake and sends admit.
func (c *coordinator) accept(admit *wirepb.Admit) *link {
	c.t.Helper()
	c.ln.(*net.TCPListener).SetDeadline(time.Now().Add(frameWait))
	nc, err := c.ln.Accept()
	if err != nil {
		c.t.Fatalf("accept a rank: %v", err)
	}
	conn, hello, err := wire.ServerHandshake(context.Background(), nc, c.keys, nil)
	if err != nil {
		c.t.Fatalf("handshake: %v", err)
	}
	l := &link{t: c.t, rank: hello.Rank, conn: conn, raw: nc.(*net.TCPConn),
		frames: make(chan proto.Message, 4096), done: make(chan struct{}), relay: c.relay}
	c.relay.join(l, hello.World)
	go func() {
		defer close(l.done)
		for {
			m, err := conn.Receive(context.Background())
			if err != nil {
				return
			}
			// The meeting and the relay are answered here, as the
			// coordinator would, so tests see only the conversation.
			switch v := m.(type) {
			case *wirepb.MeetRequest:
				conn.Send(context.Background(), &wirepb.Meeting{Kind: v.GetKind()})
				continue
			case *wirepb.RelayPost:
				c.relay.post(l.rank, v)
				continue
			}
			l.frames <- m
		}
	}()
	c.t.Cleanup(func() { conn.Close(); <-l.done })
	if admit != nil {
		l.send(admit)
	}
	return l
}

// acceptAll accepts n ranks and returns their links by rank.
func (c *coordinator) acceptAll(n int, admit *wirepb.Admit) []*link {
	c.t.Helper()
	links := make([]*link, n)
	for range n {
		l := c.accept(admit)
		if int(l.rank) >= n || links[l.rank] != nil {
			c.t.Fatalf("unexpected rank %d", l.rank)
		}
		links[l.rank] = l
	}
	return links
}

func (l *link) send(m proto.Message) {
	l.t.Helper()
	if dd, ok := m.(*wirepb.DeclareDead); ok {
		l.relay.dead(dd.GetRank())
	}
	if err := l.conn.Send(context.Background(), m); err != nil {
		l.t.Fatalf("send %T to rank %d: %v", m, l.rank, err)
	}
}

// periodic frames come at any time; next skips them.
func periodic(m proto.Message) bool {
	switch m.(type) {
	case *wirepb.Heartbeat, *wirepb.ResourceSample:
		return true
	}
	return false
}

// next returns the next frame that is not periodic, or nil if none comes
// within d or the rank closed the link.
func (l *link) next(d time.Duration) proto.Message {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case m := <-l.frames:
			l.seen = append(l.seen, m)
			if !periodic(m) {
				return m
			}
		case <-l.done:
			// Frames read before the close are still in the channel.
			select {
			case m := <-l.frames:
				l.seen = append(l.seen, m)
				if !periodic(m) {
					return m
				}
				continue
			default:
			}
			return nil
		case <-timer.C:
			return nil
		}
	}
}

// expect returns the next non-periodic frame, which must be a T.
func expect[T proto.Message](l *link) T {
	l.t.Helper()
	m := l.next(frameWait)
	t, ok := m.(T)
	if !ok {
		var want T
		l.t.Fatalf("rank %d: got %s, want %T", l.rank, describe(m), want)
	}
	return t
}

// expectPlan reads a plan's n Batch frames and its Metrics.
func expectPlan(l *link, n int) *wirepb.Metrics {
	l.t.Helper()
	return expectPlanRest(l, 0, n)
}

// expectPlanRest reads the rest of a plan of n batches of which read Batch
// frames were already read, then its Metrics.
func expectPlanRest(l *link, read, n int) *wirepb.Metrics {
	l.t.Helper()
	for i := read; i < n; i++ {
		b := expect[*wirepb.Batch](l)
		if b.GetRank() != l.rank {
			l.t.Fatalf("batch %d names rank %d, sent by rank %d", i, b.GetRank(), l.rank)
		}
	}
	m := expect[*wirepb.Metrics](l)
	if m.GetBatches() != uint64(n) || m.GetRank() != l.rank {
		l.t.Fatalf("rank %d: Metrics = %v, want %d batches", l.rank, m, n)
	}
	return m
}

// expectLostRound reads past Batch and SnapshotReady frames to the
// round's SyncAck and then the PluginRestarted of a trainer lost while
// the round ran: the coordinator must hear of the round first.
func expectLostRound(l *link) (*wirepb.SyncAck, *wirepb.PluginRestarted) {
	l.t.Helper()
	var ack *wirepb.SyncAck
	var pr *wirepb.PluginRestarted
	for ack == nil || pr == nil {
		switch m := l.next(frameWait).(type) {
		case *wirepb.Batch, *wirepb.SnapshotReady:
		case *wirepb.SyncAck:
			ack = m
		case *wirepb.PluginRestarted:
			if ack == nil {
				l.t.Fatalf("PluginRestarted before the round's SyncAck: %v", m)
			}
			pr = m
		case nil:
			l.t.Fatalf("no more frames: SyncAck %v, PluginRestarted %v", ack, pr)
		default:
			l.t.Fatalf("got %s, want the round's SyncAck and PluginRestarted", describe(m))
		}
	}
	return ack, pr
}

// expectRoundDone reads past SnapshotReady frames to round's SyncAck,
// which must not be aborted.
func expectRoundDone(l *link, round uint64) {
	l.t.Helper()
	for {
		m := l.next(frameWait)
		if _, ok := m.(*wirepb.SnapshotReady); ok {
			continue
		}
		if ack, ok := m.(*wirepb.SyncAck); !ok || ack.GetAborted() || ack.GetRound() != round {
			l.t.Fatalf("got %s, want round %d's SyncAck", describe(m), round)
		}
		return
	}
}

// drain reads until the rank closes the link and returns every frame
// received on it, periodic ones included.
func (l *link) drain() []proto.Message {
	l.t.Helper()
	for {
		select {
		case m := <-l.frames:
			l.seen = append(l.seen, m)
		case <-l.done:
			for {
				select {
				case m := <-l.frames:
					l.seen = append(l.seen, m)
				default:
					return l.seen
				}
			}
		case <-time.After(frameWait):
			l.t.Fatalf("rank %d did not close its link", l.rank)
		}
	}
}

func hasExiting(frames []proto.Message) bool {
	for _, m := range frames {
		if _, ok := m.(*wirepb.Exiting); ok {
			return true
		}
	}
	return false
}

func describe(m proto.Message) string {
	if m == nil {
		return "nothing"
	}
	return fmt.Sprintf("%T %v", m, m)
}

// trainerSettings are small and fast; tweak fields per test.
func trainerSettings() plugintest.TrainerSettings {
	return plugintest.TrainerSettings{Samples: 256, EvalSamples: 64, Features: 8, BatchSize: 16, LR: 0.1, SleepPerBatch: "0"}
}

// options are a test worker's options against c.
func (c *coordinator) options(rank, world uint32, ts plugintest.TrainerSettings) worker.Options {
	return worker.Options{
		Coordinator:     c.addr(),
		Rank:            rank,
		World:           world,
		Secret:          testSecret,
		Trainer:         config.Plugin{Name: "mock", Settings: ts.JSON()},
		Averager:        config.Plugin{Name: "mock", Settings: []byte(`{}`)},
		LivenessTimeout: 10 * time.Second,
		ConnectTimeout:  5 * time.Second,
		ShutdownGrace:   2 * time.Second,
		ArenaDir:        c.t.TempDir(),
		Logger:          testLogger(),
	}
}

// inProcess gives a worker in-process mock plugins and returns the trainer.
func inProcess(o *worker.Options) *plugintest.Trainer {
	tr := plugintest.NewTrainer(nil)
	o.Plugins = worker.InProcess(tr, plugintest.NewAverager(nil))
	return tr
}

// running is a worker started by start.
type running struct {
	t     *testing.T
	errc  chan error
	start time.Time
}

// start runs a worker until it returns; the test's end cancels it.
func start(t *testing.T, o worker.Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, errc: make(chan error, 1), start: time.Now()}
	go func() { r.errc <- worker.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.errc:
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not return after its context was cancelled")
		}
	})
	return r
}

// wait returns Run's result, failing the test if it takes longer than d.
func (r *running) wait(d time.Duration) error {
	r.t.Helper()
	select {
	case err := <-r.errc:
		r.errc <- err // for the cleanup
		return err
	case <-time.After(d):
		r.t.Fatalf("worker still running after %v", d)
		return nil
	}
}

// expectNoWorkerGoroutines fails if a goroutine of package worker is still
// running: Run must join every goroutine it started.
func expectNoWorkerGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var left []string
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "cohort/core/worker.(*worker)") || strings.Contains(g, "cohort/core/worker.goTask") {
				left = append(left, g)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d worker goroutines outlived Run:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// plan builds an EpochPlan.
func plan(epoch, offset, size, seed, pickSpace uint64) *wirepb.EpochPlan {
	return &wirepb.EpochPlan{Epoch: epoch, PartitionOffset: offset, PartitionSize: size, Seed: seed, PickSpace: pickSpace}
}

// testRelay is the test coordinator's relay: an exchange completes once
// every rank not declared dead has posted; a DeclareDead the test sends
// fails the exchanges in flight, as the coordinator does.
type testRelay struct {
	mu     sync.Mutex
	world  uint32
	links  map[uint32]*link
	gone   map[uint32]bool
	posts  map[string]map[uint32][]byte
	failed map[string]bool
}

func (r *testRelay) join(l *link, world uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.world = world
	r.links[l.rank] = l
}

func (r *testRelay) post(rank uint32, m *wirepb.RelayPost) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := m.GetKey()
	if r.failed[key] {
		r.links[rank].conn.Send(context.Background(), &wirepb.RelayResult{Key: key, Error: "a rank died"})
		return
	}
	if r.posts[key] == nil {
		r.posts[key] = map[uint32][]byte{}
	}
	r.posts[key][rank] = m.GetBlob()
	if len(r.posts[key]) < int(r.world)-len(r.gone) {
		return
	}
	res := &wirepb.RelayResult{Key: key}
	for i := range r.world {
		if b, ok := r.posts[key][i]; ok {
			res.Blobs = append(res.Blobs, &wirepb.RelayBlob{Rank: i, Blob: b})
		}
	}
	for _, b := range res.Blobs {
		r.links[b.Rank].conn.Send(context.Background(), res)
	}
	delete(r.posts, key)
}

func (r *testRelay) dead(rank uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone == nil {
		r.gone, r.failed = map[uint32]bool{}, map[string]bool{}
	}
	if r.gone[rank] {
		return
	}
	r.gone[rank] = true
	for key, posts := range r.posts {
		for p := range posts {
			r.links[p].conn.Send(context.Background(), &wirepb.RelayResult{Key: key, Error: "a rank died"})
		}
		r.failed[key] = true
		delete(r.posts, key)
	}
}
