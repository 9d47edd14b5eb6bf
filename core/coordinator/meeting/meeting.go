// Package meeting is where a run's averagers find each other: the meeting
// points the coordinator starts by kind (the relay, the reduce server, or a
// kind Options.Meetings adds), and the relay itself, an all-gather of small
// blobs among the live ranks. A Table holds the points for the whole run;
// a Hub answers the ranks' MeetRequest and RelayPost frames on the loop.
//
// Neighbours: core/reduceserver (the reduce server it starts) and core/wire
// below; above it core/coordinator, whose loop hands the Hub its frames and
// its deaths, and whose membership table is the Hub's Outbox.
package meeting

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/reduceserver"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// A Point is where the averagers of one meeting kind meet their
// peers: the coordinator starts one per kind the ranks ask for
// (MeetRequest, naming the kind their averager's Describe declared), hands
// its endpoint to every rank, tells it of deaths and closes it when the run
// ends. The kind decides, never the averager's name.
type Point interface {
	// Endpoint is handed to each rank's averager as is; ":port" means
	// that port on the host the rank dialled the coordinator at.
	Endpoint() string
	// MarkDead takes a rank out of every later round.
	MarkDead(rank uint32)
	Close() error
}

// RoundBytes is what a Point that carries the rounds' data itself
// reports for the summary's bytes_per_round.
type RoundBytes interface {
	// Bulk is the rounds served and the data bytes moved over the
	// network in them.
	Bulk() (rounds, bytes uint64)
}

// Env is what a meeting point starts from.
type Env struct {
	// Listen is the control server's listen address; a meeting point
	// that listens does so on its host.
	Listen string
	// ReducePort is the reduce server's port (coordinator.reduce_port);
	// 0 picks any free port.
	ReducePort int
	// TLS is coordinator.tls's server configuration (nil: plain TCP); a
	// meeting point that listens puts its ranks behind it.
	TLS *tls.Config
	// Keys are the run's; DataKey is derived from them for the averagers'
	// own data channels.
	Keys   wire.Keys
	RunID  string
	World  uint32
	Logger hclog.Logger
}

// Factory starts the meeting point of one kind.
type Factory func(Env) (Point, error)

// builtin are the kinds every coordinator serves; the coordinator's
// Options.Meetings adds to or replaces them.
func builtin() map[string]Factory {
	return map[string]Factory{
		plugin.MeetRelay:        startRelayMeeting,
		plugin.MeetReduceServer: startReduceServer,
	}
}

// relayMeeting is the meeting point of averagers that meet through the
// relay alone: nothing to start, no endpoint. The relay itself runs on the
// coordinator's loop (relay.go), for every averager.
type relayMeeting struct{}

func startRelayMeeting(Env) (Point, error) { return relayMeeting{}, nil }

func (relayMeeting) Endpoint() string { return "" }
func (relayMeeting) MarkDead(uint32)  {}
func (relayMeeting) Close() error     { return nil }

// reduceMeeting is the reduce server (core/reduceserver) as a meeting point.
type reduceMeeting struct {
	*reduceserver.Server
	endpoint string
}

// startReduceServer listens on the host the control server listens on.
// When that host is unspecified (all interfaces) the endpoint handed to
// ranks is ":port", which a rank completes with the coordinator host it
// dialled.
func startReduceServer(env Env) (Point, error) {
	host, _, err := net.SplitHostPort(env.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", env.Listen, err)
	}
	key, err := env.Keys.Derive(wire.AveragingDataKeyLabel)
	if err != nil {
		return nil, fmt.Errorf("reduce server key: %w", err)
	}
	srv, err := reduceserver.Listen(context.Background(), reduceserver.Config{
		Addr:   net.JoinHostPort(host, strconv.Itoa(env.ReducePort)),
		Key:    key,
		RunID:  env.RunID,
		World:  env.World,
		Logger: env.Logger,
		TLS:    env.TLS,
	})
	if err != nil {
		return nil, fmt.Errorf("start the reduce server: %w", err)
	}
	endpoint := srv.Addr()
	if h, port, err := net.SplitHostPort(endpoint); err == nil {
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			endpoint = ":" + port
		}
	}
	return reduceMeeting{Server: srv, endpoint: endpoint}, nil
}

func (m reduceMeeting) Endpoint() string { return m.endpoint }

func (m reduceMeeting) Bulk() (rounds, bytes uint64) {
	st := m.Stats()
	return st.Rounds, st.BulkBytes
}

// Table is the coordinator's table of meeting kinds and the points it
// started. Only the loop touches it while the run runs; Close after.
type Table struct {
	env       Env
	factories map[string]Factory
	started   map[string]Point
}

// NewTable serves the built-in kinds and extra's, which replace a built-in
// one of the same name.
func NewTable(env Env, extra map[string]Factory) *Table {
	f := builtin()
	maps.Copy(f, extra)
	return &Table{env: env, factories: f, started: map[string]Point{}}
}

// point returns the meeting point of kind, starting it on first use.
func (m *Table) point(kind string) (Point, error) {
	if p, ok := m.started[kind]; ok {
		return p, nil
	}
	f, ok := m.factories[kind]
	if !ok {
		return nil, fmt.Errorf("this coordinator serves no meeting kind %q (it serves %v): the averager plugin and cohort disagree", kind, slices.Sorted(maps.Keys(m.factories)))
	}
	p, err := f(m.env)
	if err != nil {
		return nil, fmt.Errorf("start the %q meeting point: %w", kind, err)
	}
	m.started[kind] = p
	return p, nil
}

// MarkDead takes rank out of every started point's later rounds.
func (m *Table) MarkDead(rank uint32) {
	for _, p := range m.started {
		p.MarkDead(rank)
	}
}

// Bulk adds up the data moved by the meeting points that carry it.
func (m *Table) Bulk() (rounds, bytes uint64) {
	for _, p := range m.started {
		if rb, ok := p.(RoundBytes); ok {
			r, b := rb.Bulk()
			rounds, bytes = rounds+r, bytes+b
		}
	}
	return rounds, bytes
}

// Close closes every started point.
func (m *Table) Close() error {
	var errs []error
	for kind, p := range m.started {
		if err := p.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close the %q meeting point: %w", kind, err))
		}
		delete(m.started, kind)
	}
	return errors.Join(errs...)
}

// Request answers a rank's request for its averager's meeting point.
// Every rank runs the same averager, so every rank must ask for the same
// kind; a rank that asks for another is answered with an error, and its
// setup fails with it.
func (h *Hub) Request(rank uint32, m *wirepb.MeetRequest) {
	kind := m.GetKind()
	if kind == "" {
		kind = plugin.MeetRelay
	}
	reply := &wirepb.Meeting{Kind: kind}
	if h.kind != "" && kind != h.kind {
		reply.Error = fmt.Sprintf("rank %d's averager %q meets by %q, but the cohort's ranks before it asked for %q", rank, m.GetAverager(), kind, h.kind)
	} else if p, err := h.table.point(kind); err != nil {
		reply.Error = err.Error()
	} else {
		h.kind = kind
		reply.Endpoint = p.Endpoint()
	}
	if reply.Error != "" {
		h.log.Error("refused a meeting request", "rank", rank, "averager", m.GetAverager(), "kind", kind, "reason", reply.Error)
	} else {
		h.log.Debug("meeting point handed out", "rank", rank, "kind", kind, "endpoint", reply.Endpoint)
	}
	h.out.Send(rank, reply)
}
