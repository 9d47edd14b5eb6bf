// Package reduceserver is the coordinator's reduce server for CPU
// averaging, the meeting point of kind reduce-server: it admits each
// rank's data channel (shared/reduce, whose other end is the SDK's client
// in each rank's averager), keeps the membership (who is connected, who
// shares a host, who was declared dead), and runs the barrier of every
// round: it plans the round, tells each host's leader when its host
// folded, and adds up the ranks' divergence sums. Ranks of one host reduce
// among themselves through shared memory; when the cohort spans hosts, the
// host leaders sum their folds among themselves over a ring of their own
// (plugins/averaging-cpu/internal/ring). No parameter byte crosses the
// server's sockets.
//
// A connection that misbehaves (a wrong key, a tampered, short or oversized
// frame, a protocol violation) is refused or dropped with a logged error;
// the server goes on serving the others, and a dropped rank leaves the
// barrier as if it had died.
//
// Where is: the listener, admission and per-connection goroutines in
// server.go; the engine's event loop in engine.go, with membership in
// membership.go and the round barrier in barrier.go. The channel's bytes
// are shared/reduce's, its authentication shared/authframe's. The
// coordinator starts the server when a rank asks for its meeting point
// (core/coordinator, meeting.go).
package reduceserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/mtls"
	"github.com/cohortdl/cohort/shared/reduce"
)

// Config configures a Server.
type Config struct {
	// Addr is the TCP address to listen on, e.g. "127.0.0.1:0".
	Addr string
	// Key is the data key (the same bytes every rank's averager gets as
	// AveragerConfig.DataKey).
	Key []byte
	// RunID must equal every rank's AveragerConfig.RunID.
	RunID string
	// World is the number of ranks.
	World uint32
	// Layout, when set, is the parameter layout every rank must have; when
	// nil the first rank admitted fixes it and every later rank must match.
	Layout *arena.Layout
	// Timeout bounds the handshake and every read and write; a connection
	// silent for longer is dropped (both ends ping while idle). Default 30 s.
	Timeout time.Duration
	// Threads bounds the goroutines that sum host folds; 0 means GOMAXPROCS.
	Threads int
	// Logger receives the server's log lines; nil discards them.
	Logger hclog.Logger
	// TLS, when set (a server configuration from shared/mtls), wraps every
	// connection in mutual TLS before the channel's own handshake: a rank
	// without a certificate from its CA is refused. Nil: plain TCP.
	TLS *tls.Config
	// OnRankLost, when set, is called (from the server's goroutine; it must
	// not block) when a rank's connection fails or misbehaves, before the
	// rank leaves the barrier. It is not called for MarkDead or for a rank
	// that said goodbye.
	OnRankLost func(rank uint32, err error)
}

// Stats counts what the server did.
type Stats struct {
	Connected      int
	Rounds, Failed uint64
	// BulkBytes counts the data the host leaders' rings moved over TCP.
	BulkBytes uint64
}

// Server is a running reduce server. Its methods are safe for concurrent
// use.
type Server struct {
	cfg  Config
	log  hclog.Logger
	keys reduce.Keys
	run  [16]byte
	ln   net.Listener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	events chan event

	// mu guards the registry the handshake consults.
	mu       sync.Mutex
	geometry *reduce.Hello // the cohort's wire, counts and digests, once known
	present  map[uint32]bool
	dead     map[uint32]bool

	rounds, failed, bulk atomic.Uint64
	connected            atomic.Int64

	closeOnce sync.Once
}

// Listen starts a server on cfg.Addr. ctx bounds the server's life as Close
// does.
func Listen(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.World == 0 {
		return nil, errors.New("reduce server: world size 0")
	}
	if cfg.World > reduce.MaxMembers {
		return nil, fmt.Errorf("reduce server: world size %d over the limit of %d", cfg.World, reduce.MaxMembers)
	}
	keys, err := reduce.DeriveKeys(cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("reduce server: %w", err)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = reduce.DefaultTimeout
	}
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	var geo *reduce.Hello
	if cfg.Layout != nil {
		if err := cfg.Layout.Validate(); err != nil {
			return nil, fmt.Errorf("reduce server: %w", err)
		}
		p, b := Counts(*cfg.Layout)
		geo = &reduce.Hello{Params: p, Buffers: b, Layout: cfg.Layout.Digest()}
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("reduce server: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &Server{
		cfg: cfg, log: logger.Named("reduce"), keys: keys, run: reduce.RunDigest(cfg.RunID), ln: ln,
		ctx: sctx, cancel: cancel, events: make(chan event, 256),
		geometry: geo, present: map[uint32]bool{}, dead: map[uint32]bool{},
	}
	e := newEngine(s)
	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.acceptLoop() }()
	go func() { defer s.wg.Done(); e.run() }()
	go func() { defer s.wg.Done(); <-sctx.Done(); ln.Close() }()
	s.log.Info("reduce server listening", "addr", ln.Addr().String(), "world", cfg.World)
	return s, nil
}

// Counts returns the f32 parameter and f32 buffer elements of a layout:
// what a rank reduces with the step weight and with the mover weight.
func Counts(l arena.Layout) (params, buffers uint64) {
	for _, e := range l.Entries {
		if e.DType != arena.F32 {
			continue
		}
		n := e.Bytes / 4
		if e.Role == arena.Parameter {
			params += n
		} else {
			buffers += n
		}
	}
	return params, buffers
}

// Addr is the address the server listens on, for the ranks' averagers
// (AveragerConfig.Endpoint).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// MarkDead removes rank from the membership: it leaves the barrier of every
// later round, a round in flight that it takes part in fails (its survivors
// get an error at once), its connection is closed and it cannot rejoin.
// Idempotent.
func (s *Server) MarkDead(rank uint32) {
	if rank >= s.cfg.World {
		return
	}
	s.mu.Lock()
	s.dead[rank] = true
	s.mu.Unlock()
	s.post(event{kind: evDead, rank: rank})
}

// Stats returns counters of the server's work.
func (s *Server) Stats() Stats {
	return Stats{
		Connected: int(s.connected.Load()),
		Rounds:    s.rounds.Load(),
		Failed:    s.failed.Load(),
		BulkBytes: s.bulk.Load(),
	}
}

// Close stops the server: it closes the listener and every connection (a
// rank in a round gets an error) and returns after every goroutine it
// started has. Idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
		s.log.Info("reduce server closed", "rounds", s.rounds.Load(), "failed", s.failed.Load())
	})
	return nil
}

func (s *Server) post(ev event) bool {
	select {
	case s.events <- ev:
		return true
	case <-s.ctx.Done():
		return false
	}
}

func (s *Server) acceptLoop() {
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Error("accept failed", "error", err)
			select {
			case <-time.After(50 * time.Millisecond):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.admit(nc)
		}()
	}
}

// accept judges a verified hello; it reserves the rank's slot.
func (s *Server) accept(h reduce.Hello) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse := func(st reduce.Status, format string, a ...any) error {
		return &reduce.Refusal{Status: st, Detail: fmt.Sprintf(format, a...)}
	}
	switch {
	case s.ctx.Err() != nil:
		return refuse(reduce.RefusedClosing, "")
	case h.World != s.cfg.World:
		return refuse(reduce.RefusedWorld, "rank says %d, server has %d", h.World, s.cfg.World)
	case h.Rank >= s.cfg.World:
		return refuse(reduce.RefusedRank, "rank %d of %d", h.Rank, s.cfg.World)
	case h.Run != s.run:
		return refuse(reduce.RefusedRun, "")
	case s.dead[h.Rank]:
		return refuse(reduce.RefusedDead, "rank %d", h.Rank)
	case s.present[h.Rank]:
		return refuse(reduce.RefusedDuplicate, "rank %d", h.Rank)
	}
	if g := s.geometry; g != nil {
		switch {
		case h.Layout != g.Layout:
			return refuse(reduce.RefusedLayout, "")
		case h.Params != g.Params || h.Buffers != g.Buffers:
			return refuse(reduce.RefusedGeometry, "rank declares %d+%d elements, cohort has %d+%d", h.Params, h.Buffers, g.Params, g.Buffers)
		case g.Wire != 0 && (h.Wire != g.Wire || h.Settings != g.Settings):
			return refuse(reduce.RefusedSettings, "")
		}
	}
	if s.geometry == nil {
		g := h
		s.geometry = &g
	} else if s.geometry.Wire == 0 {
		s.geometry.Wire, s.geometry.Settings = h.Wire, h.Settings
	}
	s.present[h.Rank] = true
	return nil
}

// admit runs the handshake of one connection and starts its reader.
func (s *Server) admit(nc net.Conn) {
	if s.cfg.TLS != nil {
		tc, err := mtls.Server(s.ctx, nc, s.cfg.TLS, s.cfg.Timeout, "the rank")
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("refused a data-channel connection: TLS", "remote", nc.RemoteAddr().String(), "error", err.Error())
			}
			return
		}
		nc = tc
	}
	var reserved *uint32
	accept := func(h reduce.Hello) error {
		err := s.accept(h)
		if err == nil {
			reserved = &h.Rank
		}
		return err
	}
	conn, h, err := reduce.ServerHandshake(s.ctx, nc, s.keys, accept, reduce.Options{Timeout: s.cfg.Timeout})
	if err != nil && reserved != nil {
		// Admitted, but the ack did not go out: free the slot for a retry.
		s.mu.Lock()
		delete(s.present, *reserved)
		s.mu.Unlock()
	}
	if err != nil {
		if errors.Is(err, authframe.ErrRefused) {
			s.log.Warn("refused a rank's data channel", "remote", nc.RemoteAddr().String(), "rank", h.Rank, "error", err.Error())
		} else if s.ctx.Err() == nil {
			s.log.Warn("refused a data-channel connection", "remote", nc.RemoteAddr().String(), "error", err.Error())
		}
		return
	}
	rc := &rankConn{rank: h.Rank, conn: conn, hello: h}
	s.connected.Add(1)
	// Closing the server ends this connection whatever the engine knows of
	// it: a connection posted just as the engine stopped is in no member
	// list, and its reader would otherwise hold Close forever.
	stop := context.AfterFunc(s.ctx, func() { conn.Close() })
	defer stop()
	if !s.post(event{kind: evConnected, rc: rc}) {
		conn.Close()
		return
	}
	s.log.Debug("rank connected", "rank", h.Rank, "remote", conn.RemoteAddr().String())
	s.readLoop(rc)
}

// rankConn is one admitted rank.
type rankConn struct {
	rank  uint32
	conn  *reduce.Conn
	hello reduce.Hello
}

func (s *Server) readLoop(rc *rankConn) {
	for {
		f, err := rc.conn.Receive()
		if err != nil {
			s.post(event{kind: evLost, rc: rc, err: err})
			return
		}
		ev := event{kind: evFrame, rc: rc, frame: f}
		ev.frame.Payload = append([]byte(nil), f.Payload...)
		if !s.post(ev) {
			return
		}
		if f.Kind == reduce.KindBye {
			return
		}
	}
}
