// Package plugin is the contract between a cohort rank and its plugins,
// and everything a plugin binary needs to keep it: the Trainer and Averager
// interfaces with their domain types, the Relay an averager meets its peers
// through, Serve (a plugin's whole main), DecodeSettings for its config
// block, ErrRoundAborted and the limits (MaxMessageBytes, MaxRelayBlob,
// MaxRelayExchange, MaxScalars). It also owns the go-plugin wiring both sides share:
// the handshake, the plugin map under ProtocolVersion, and the gRPC
// adapters between the interfaces and the cohort.v1 services, whose
// generated code is internal. docs/plugins.md is the guide for writing a
// plugin; examples/trainer-softmax and examples/averaging-trimmed-mean are
// complete ones. This package is part of the SDK module,
// github.com/cohortdl/cohort/shared (SDKModule, SDKVersion).
//
// A plugin's main is one line:
//
//	func main() { plugin.Serve(plugin.ServeOptions{Name: "trainer-mock", Trainer: newTrainer}) }
//
// The host builds a go-plugin client with ClientConfig and gets the
// interface back with DispenseTrainer or DispenseAverager. Protobuf types
// never appear in this package's API; gRPC carries control messages only,
// each at most MaxMessageBytes, and parameters travel through the arena
// (package arena).
package plugin

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
)

// The cohort plugin protocol versions, negotiated through go-plugin's
// VersionedPlugins: the host offers every version it speaks and the plugin
// picks the newest it serves. A version only ever grows the one before it.
const (
	// ProtocolBase (1) is the trainer and averager services.
	ProtocolBase = 1
	// ProtocolRelay (2) is ProtocolBase plus the relay: the host serves a
	// Relay on the go-plugin broker and names it in the averager's
	// Configure (relay_broker_id). Under ProtocolBase an averager gets no
	// Relay (AveragerConfig.Relay is nil) and the host sends no broker id.
	ProtocolRelay = 2
	// ProtocolLoadReason (3) is ProtocolRelay plus the load reason: the
	// host says in LoadCheckpoint whether the trainer resumes a run or
	// replaces a lost trainer (LoadReason), and the trainer answers whether
	// it kept the checkpoint's parameters. Under an older version the host
	// sends no reason, the plugin treats the load as a resume, and the host
	// puts the arena's newer values back itself after a replacement's load.
	ProtocolLoadReason = 3
	// ProtocolMergedReports (4) is ProtocolLoadReason plus merged batch
	// reports: the host may let a plan's reports merge in the plugin
	// (Plan.ReportMerge), and the plugin then sends them a message per
	// interval instead of one per batch. Under an older version the host
	// asks for none, and every report is a message of its own.
	ProtocolMergedReports = 4
	// ProtocolVersion is the newest version, the one Serve serves by
	// default.
	ProtocolVersion = ProtocolMergedReports
	// OldestProtocol is the oldest version a host still speaks.
	OldestProtocol = ProtocolBase
)

// Protocols returns the protocol versions this SDK speaks, oldest first.
func Protocols() []int {
	out := make([]int, 0, ProtocolVersion-OldestProtocol+1)
	for v := OldestProtocol; v <= ProtocolVersion; v++ {
		out = append(out, v)
	}
	return out
}

// ProtocolRange spells Protocols for people: "1-3".
func ProtocolRange() string {
	if OldestProtocol == ProtocolVersion {
		return fmt.Sprint(ProtocolVersion)
	}
	return fmt.Sprintf("%d-%d", OldestProtocol, ProtocolVersion)
}

// The plugin kinds; a plugin binary serves exactly one.
const (
	KindTrainer  = "trainer"
	KindAverager = "averager"
)

// MaxMessageBytes bounds every gRPC message in both directions, on both
// sides. gRPC carries control only (parameters never ride it), but a layout
// of many tensors or a large settings block can pass go-plugin's 4 MiB
// server default.
const MaxMessageBytes = 64 << 20

// Handshake is the go-plugin handshake every cohort plugin and host shares.
// The magic cookie only tells a plugin binary it was started by a cohort
// host; it is not a secret. The protocol version is negotiated through
// VersionedPlugins instead of being fixed here.
func Handshake() goplugin.HandshakeConfig {
	return goplugin.HandshakeConfig{
		MagicCookieKey:   "COHORT_PLUGIN_MAGIC_COOKIE",
		MagicCookieValue: "7c1d9e4a2f6b08e5d3a1c47b9f20e6d85a3c1b7e",
	}
}

// TrainerPlugin is the go-plugin Plugin for the trainer kind. In a plugin
// Impl is the implementation being served; on the host it is unused.
// Protocol is the protocol version this value speaks (0: ProtocolVersion):
// from ProtocolLoadReason on the host sends LoadCheckpoint's reason, from
// ProtocolMergedReports on Plan.ReportMerge.
type TrainerPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl     Trainer
	Protocol int
}

// GRPCServer registers Impl as the cohort.v1.Trainer service.
func (p TrainerPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("trainer plugin: no implementation to serve")
	}
	pb.RegisterTrainerServer(s, &trainerServer{impl: p.Impl})
	return nil
}

// GRPCClient returns a Trainer that calls the plugin over c.
func (p TrainerPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &trainerClient{
		rpc:     pb.NewTrainerClient(c),
		reasons: p.Protocol == 0 || p.Protocol >= ProtocolLoadReason,
		merges:  p.Protocol == 0 || p.Protocol >= ProtocolMergedReports,
	}, nil
}

// AveragerPlugin is the go-plugin Plugin for the averager kind. In a plugin
// Impl is the implementation being served; on the host it is unused.
// Protocol is the protocol version this value speaks (0: ProtocolVersion):
// from ProtocolRelay on the broker carries the host's Relay.
type AveragerPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Impl     Averager
	Protocol int
}

func (p AveragerPlugin) relays() bool {
	return p.Protocol == 0 || p.Protocol >= ProtocolRelay
}

// GRPCServer registers Impl as the cohort.v1.Averager service.
// The broker carries the host's Relay back to the plugin.
func (p AveragerPlugin) GRPCServer(broker *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("averager plugin: no implementation to serve")
	}
	srv := &averagerServer{impl: p.Impl}
	if p.relays() {
		srv.relay = &pluginRelayDialer{broker: broker}
	}
	pb.RegisterAveragerServer(s, srv)
	return nil
}

// GRPCClient returns an Averager that calls the plugin over c and, from
// ProtocolRelay on, serves the Relay a Configure names on broker.
func (p AveragerPlugin) GRPCClient(_ context.Context, broker *goplugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	cl := &averagerClient{rpc: pb.NewAveragerClient(c)}
	if p.relays() {
		cl.relay = &hostRelay{broker: broker}
	}
	return cl, nil
}

var (
	_ goplugin.GRPCPlugin = TrainerPlugin{}
	_ goplugin.GRPCPlugin = AveragerPlugin{}
)

// serverOptions raise gRPC's limits on the plugin side to MaxMessageBytes
// (grpc-go's server default for receiving is 4 MiB).
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
	}
}

// newGRPCServer is the ServeConfig.GRPCServer factory. It must not register
// the health service: go-plugin's GRPCServer.Init registers grpc.health.v1
// with the "plugin" service SERVING on the server this returns (that is
// what Client.Ping checks), and gRPC refuses a second registration.
func newGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append(opts, serverOptions()...)...)
}

// dialOptions set the host side's call limits to MaxMessageBytes. They come
// after go-plugin's own defaults (unlimited), so they decide.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(MaxMessageBytes),
			grpc.MaxCallSendMsgSize(MaxMessageBytes),
		),
	}
}

// ClientOptions are the host's choices for one plugin process.
type ClientOptions struct {
	// Cmd is the unstarted plugin command.
	Cmd *exec.Cmd
	// Logger receives go-plugin's own lines and the plugin's log lines
	// (its hclog JSON on stderr, re-logged under Logger's own name, without
	// the plugin's timestamp and logger name) and anything the plugin
	// writes to os.Stdout or os.Stderr once it serves. Nil means an
	// info-level logger on stderr.
	Logger hclog.Logger
	// SecureConfig, when set, makes the client check the binary's checksum
	// before starting it.
	SecureConfig *goplugin.SecureConfig
	// StartTimeout bounds the wait for the plugin's handshake; 0 means
	// go-plugin's default of one minute.
	StartTimeout time.Duration
}

// ClientConfig builds the host side of one plugin: cohort's handshake,
// every protocol version of Protocols with both kinds, gRPC only, mutual
// TLS on the plugin's socket (AutoMTLS: the host makes a fresh key pair per
// plugin and hands the plugin its certificate, so no other process on the
// machine can call the plugin even when it can reach the socket), and the
// MaxMessageBytes call limits. Pass it to goplugin.NewClient; the host owns
// the client and ends it with Kill after the application's Shutdown RPC.
func ClientConfig(o ClientOptions) *goplugin.ClientConfig {
	logger := o.Logger
	if logger == nil {
		logger = hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Info})
	}
	logger = newRelogger(logger)
	cfg := &goplugin.ClientConfig{
		HandshakeConfig:  Handshake(),
		VersionedPlugins: versionedPluginSets(),
		Cmd:              o.Cmd,
		SecureConfig:     o.SecureConfig,
		StartTimeout:     o.StartTimeout,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           logger,
		GRPCDialOptions:  dialOptions(),
	}
	// go-plugin streams the plugin's os.Stdout and os.Stderr (after Serve
	// took them over) to these writers and drops them when they are nil;
	// route them into the log instead.
	w := logger.StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true})
	cfg.SyncStdout, cfg.SyncStderr = w, w
	return cfg
}

// versionedPluginSets are the plugin maps of every protocol version, as
// the host sees them.
func versionedPluginSets() map[int]goplugin.PluginSet {
	out := map[int]goplugin.PluginSet{}
	for _, v := range Protocols() {
		out[v] = goplugin.PluginSet{
			KindTrainer:  TrainerPlugin{Protocol: v},
			KindAverager: AveragerPlugin{Protocol: v},
		}
	}
	return out
}

// DispenseTrainer starts c's plugin if needed and returns its Trainer.
func DispenseTrainer(c *goplugin.Client) (Trainer, error) {
	raw, err := dispense(c, KindTrainer)
	if err != nil {
		return nil, err
	}
	t, ok := raw.(Trainer)
	if !ok {
		return nil, fmt.Errorf("dispense %s plugin: got %T, not a Trainer", KindTrainer, raw)
	}
	return t, nil
}

// DispenseAverager starts c's plugin if needed and returns its Averager.
func DispenseAverager(c *goplugin.Client) (Averager, error) {
	raw, err := dispense(c, KindAverager)
	if err != nil {
		return nil, err
	}
	a, ok := raw.(Averager)
	if !ok {
		return nil, fmt.Errorf("dispense %s plugin: got %T, not an Averager", KindAverager, raw)
	}
	return a, nil
}

func dispense(c *goplugin.Client, kind string) (any, error) {
	if c == nil {
		return nil, fmt.Errorf("dispense %s plugin: no client", kind)
	}
	rpc, err := c.Client()
	if err != nil {
		return nil, fmt.Errorf("start %s plugin: %w", kind, err)
	}
	if v := c.NegotiatedVersion(); v < OldestProtocol || v > ProtocolVersion {
		return nil, fmt.Errorf("%s plugin speaks cohort plugin protocol %d; this cohort speaks %s: %w", kind, v, ProtocolRange(), ErrProtocol)
	}
	raw, err := rpc.Dispense(kind)
	if err != nil {
		return nil, fmt.Errorf("dispense %s plugin: %w", kind, err)
	}
	return raw, nil
}
