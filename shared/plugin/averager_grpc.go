package plugin

import (
	"context"
	"errors"

	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
)

// averagerServer serves an Averager implementation as the cohort.v1.Averager
// gRPC service, in the plugin process. It holds no lock: gRPC runs each call
// on its own goroutine, so Abort reaches the implementation while Average
// is still in flight.
type averagerServer struct {
	pb.UnimplementedAveragerServer
	impl  Averager
	relay *pluginRelayDialer
}

func (s *averagerServer) Describe(ctx context.Context, _ *pb.DescribeRequest) (*pb.PluginDescription, error) {
	d, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, statusError(err)
	}
	return toprotoDescription(d), nil
}

func (s *averagerServer) Configure(ctx context.Context, req *pb.AveragerConfigureRequest) (*pb.AveragerConfigureResponse, error) {
	cfg, err := fromprotoAveragerConfig(req)
	if err != nil {
		return nil, invalidRequest("Configure", err)
	}
	// A server without a dialer speaks ProtocolBase, which has no relay.
	if id := req.GetRelayBrokerId(); id != 0 && s.relay != nil {
		if cfg.Relay, err = s.relay.dial(id); err != nil {
			return nil, invalidRequest("Configure", err)
		}
	}
	traits, err := s.impl.Configure(ctx, cfg)
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.AveragerConfigureResponse{SoloIdentity: traits.SoloIdentity}, nil
}

func (s *averagerServer) Average(ctx context.Context, req *pb.AverageRequest) (*pb.AverageResponse, error) {
	r, err := s.impl.Average(ctx, fromprotoRound(req))
	if err != nil {
		return nil, statusError(err)
	}
	return toprotoRoundResult(r), nil
}

func (s *averagerServer) NewSessionId(ctx context.Context, _ *pb.NewSessionIdRequest) (*pb.NewSessionIdResponse, error) {
	id, err := s.impl.NewSessionID(ctx)
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.NewSessionIdResponse{SessionId: id}, nil
}

func (s *averagerServer) NewSession(ctx context.Context, req *pb.NewSessionRequest) (*pb.NewSessionResponse, error) {
	if err := s.impl.NewSession(ctx, fromprotoSession(req)); err != nil {
		return nil, statusError(err)
	}
	return &pb.NewSessionResponse{}, nil
}

func (s *averagerServer) Abort(ctx context.Context, req *pb.AbortRequest) (*pb.AbortResponse, error) {
	if err := s.impl.Abort(ctx, req.GetReason()); err != nil {
		return nil, statusError(err)
	}
	return &pb.AbortResponse{}, nil
}

func (s *averagerServer) SaveState(ctx context.Context, req *pb.SaveCheckpointRequest) (*pb.SaveCheckpointResponse, error) {
	files, err := s.impl.SaveState(ctx, req.GetDir())
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.SaveCheckpointResponse{Files: files}, nil
}

func (s *averagerServer) LoadState(ctx context.Context, req *pb.LoadCheckpointRequest) (*pb.LoadStateResponse, error) {
	if err := s.impl.LoadState(ctx, req.GetDir()); err != nil {
		return nil, statusError(err)
	}
	return &pb.LoadStateResponse{}, nil
}

func (s *averagerServer) Shutdown(ctx context.Context, _ *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	if err := s.impl.Shutdown(ctx); err != nil {
		return nil, statusError(err)
	}
	return &pb.ShutdownResponse{}, nil
}

// averagerClient is the host's Averager: every method is one call to the
// plugin's cohort.v1.Averager service. Calls share one connection and do
// not wait for each other. relay is nil under ProtocolBase: a plugin of
// that version gets no Relay.
type averagerClient struct {
	rpc   pb.AveragerClient
	relay *hostRelay
}

var _ Averager = (*averagerClient)(nil)

func (c *averagerClient) Describe(ctx context.Context) (Description, error) {
	resp, err := c.rpc.Describe(ctx, &pb.DescribeRequest{})
	if err != nil {
		return Description{}, callError(ctx, "Averager.Describe", err)
	}
	return fromprotoDescription(resp), nil
}

func (c *averagerClient) Configure(ctx context.Context, cfg AveragerConfig) (AveragerTraits, error) {
	const op = "Averager.Configure"
	req, err := toprotoAveragerConfig(cfg)
	if err != nil {
		return AveragerTraits{}, errors.New(op + ": " + err.Error())
	}
	if cfg.Relay != nil && c.relay != nil {
		if c.relay.broker == nil {
			return AveragerTraits{}, errors.New(op + ": a relay needs a go-plugin broker, and this client has none")
		}
		req.RelayBrokerId = c.relay.serve(cfg.Relay)
	}
	resp, err := c.rpc.Configure(ctx, req)
	if err != nil {
		return AveragerTraits{}, callError(ctx, op, err)
	}
	return AveragerTraits{SoloIdentity: resp.GetSoloIdentity()}, nil
}

func (c *averagerClient) Average(ctx context.Context, r Round) (RoundResult, error) {
	resp, err := c.rpc.Average(ctx, toprotoRound(r))
	if err != nil {
		return RoundResult{}, callError(ctx, "Averager.Average", err)
	}
	return fromprotoRoundResult(resp), nil
}

func (c *averagerClient) NewSessionID(ctx context.Context) ([]byte, error) {
	resp, err := c.rpc.NewSessionId(ctx, &pb.NewSessionIdRequest{})
	if err != nil {
		return nil, callError(ctx, "Averager.NewSessionID", err)
	}
	if id := resp.GetSessionId(); len(id) > 0 {
		return id, nil
	}
	return nil, nil
}

func (c *averagerClient) NewSession(ctx context.Context, s Session) error {
	_, err := c.rpc.NewSession(ctx, toprotoSession(s))
	return callError(ctx, "Averager.NewSession", err)
}

func (c *averagerClient) Abort(ctx context.Context, reason string) error {
	_, err := c.rpc.Abort(ctx, &pb.AbortRequest{Reason: reason})
	return callError(ctx, "Averager.Abort", err)
}

func (c *averagerClient) SaveState(ctx context.Context, dir string) ([]string, error) {
	resp, err := c.rpc.SaveState(ctx, &pb.SaveCheckpointRequest{Dir: dir})
	if err != nil {
		return nil, callError(ctx, "Averager.SaveState", err)
	}
	if files := resp.GetFiles(); len(files) > 0 {
		return files, nil
	}
	return nil, nil
}

func (c *averagerClient) LoadState(ctx context.Context, dir string) error {
	_, err := c.rpc.LoadState(ctx, &pb.LoadCheckpointRequest{Dir: dir})
	return callError(ctx, "Averager.LoadState", err)
}

func (c *averagerClient) Shutdown(ctx context.Context) error {
	_, err := c.rpc.Shutdown(ctx, &pb.ShutdownRequest{})
	return callError(ctx, "Averager.Shutdown", err)
}
