package plugin

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// trainerServer serves a Trainer implementation as the cohort.v1.Trainer
// gRPC service, in the plugin process.
type trainerServer struct {
	pb.UnimplementedTrainerServer
	impl Trainer
}

func (s *trainerServer) Describe(ctx context.Context, _ *pb.DescribeRequest) (*pb.PluginDescription, error) {
	d, err := s.impl.Describe(ctx)
	if err != nil {
		return nil, statusError(err)
	}
	return toprotoDescription(d), nil
}

func (s *trainerServer) Configure(ctx context.Context, req *pb.TrainerConfigureRequest) (*pb.TrainerConfigureResponse, error) {
	setup, err := s.impl.Configure(ctx, fromprotoTrainerConfig(req))
	if err != nil {
		return nil, statusError(err)
	}
	resp, err := toprotoTrainerSetup(setup)
	if err != nil {
		return nil, statusError(errors.New("trainer returned an unencodable layout: " + err.Error()))
	}
	return resp, nil
}

func (s *trainerServer) Attach(ctx context.Context, req *pb.AttachRequest) (*pb.AttachResponse, error) {
	d, err := fromprotoDescriptor(req.GetArena())
	if err != nil {
		return nil, invalidRequest("Attach", err)
	}
	zeroCopy, err := s.impl.Attach(ctx, d)
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.AttachResponse{ZeroCopy: zeroCopy}, nil
}

func (s *trainerServer) Train(req *pb.TrainRequest, stream pb.Trainer_TrainServer) error {
	plan := fromprotoPlan(req)
	// A stream may not be written from two goroutines at once, nor after
	// the handler returned; an implementation that reports from a worker
	// thread gets an error instead of a corrupted stream. Reports go as
	// they come unless the host let them merge (Plan.ReportMerge).
	var (
		mu   sync.Mutex
		done bool
		out  = reportSender{stream: stream, every: plan.ReportMerge, last: time.Now()}
	)
	report := func(r BatchReport) error {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return errors.New("batch report after Train returned")
		}
		return out.add(toprotoBatchReport(r))
	}
	err := s.impl.Train(stream.Context(), plan, report)
	mu.Lock()
	done = true
	// What the trainer reported goes before its error, if any: the host
	// counts every batch the model holds.
	ferr := out.flush()
	mu.Unlock()
	if err == nil {
		err = ferr
	}
	return statusError(err)
}

// maxMergedReports bounds one merged message: at most MaxScalars named
// figures a report, it stays far below MaxMessageBytes.
const maxMergedReports = 1024

// reportSender sends a Train stream's reports: each as it comes, or, with
// every set, those of one interval together.
type reportSender struct {
	stream  pb.Trainer_TrainServer
	every   time.Duration
	last    time.Time // the last send, or the plan's start
	pending []*pb.BatchReport
}

func (s *reportSender) add(r *pb.BatchReport) error {
	s.pending = append(s.pending, r)
	if s.every > 0 && len(s.pending) < maxMergedReports && time.Since(s.last) < s.every {
		return nil
	}
	return s.flush()
}

func (s *reportSender) flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	err := s.stream.Send(&pb.TrainReports{Reports: s.pending})
	s.pending, s.last = nil, time.Now()
	return err
}

func (s *trainerServer) Publish(ctx context.Context, _ *pb.PublishRequest) (*pb.PublishResponse, error) {
	r, err := s.impl.Publish(ctx)
	if err != nil {
		return nil, statusError(err)
	}
	return toprotoPublishResult(r), nil
}

func (s *trainerServer) Adopt(ctx context.Context, req *pb.AdoptRequest) (*pb.AdoptResponse, error) {
	norm, err := s.impl.Adopt(ctx, req.GetBlendAlpha())
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.AdoptResponse{ParamNorm: norm}, nil
}

func (s *trainerServer) Evaluate(ctx context.Context, _ *pb.EvaluateRequest) (*pb.EvaluateResponse, error) {
	r, err := s.impl.Evaluate(ctx)
	if err != nil {
		return nil, statusError(err)
	}
	return toprotoEvalResult(r), nil
}

func (s *trainerServer) ExportDevice(ctx context.Context, _ *pb.ExportDeviceRequest) (*pb.ExportDeviceResponse, error) {
	e, ok := s.impl.(DeviceExporter)
	if !ok {
		return &pb.ExportDeviceResponse{}, nil
	}
	b, ok, err := e.ExportDevice(ctx)
	if err != nil || !ok {
		return &pb.ExportDeviceResponse{}, err
	}
	return &pb.ExportDeviceResponse{Device: toprotoDevice(&b)}, nil
}

func (s *trainerServer) EpochEnd(ctx context.Context, req *pb.EpochEndRequest) (*pb.EpochEndResponse, error) {
	e, ok := s.impl.(EpochEnder)
	if !ok {
		return &pb.EpochEndResponse{}, nil
	}
	ran, err := e.EpochEnd(ctx, req.GetEpoch())
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.EpochEndResponse{Ran: ran}, nil
}

func (s *trainerServer) SaveCheckpoint(ctx context.Context, req *pb.SaveCheckpointRequest) (*pb.SaveCheckpointResponse, error) {
	files, err := s.impl.SaveCheckpoint(ctx, req.GetDir())
	if err != nil {
		return nil, statusError(err)
	}
	return &pb.SaveCheckpointResponse{Files: files}, nil
}

func (s *trainerServer) LoadCheckpoint(ctx context.Context, req *pb.LoadCheckpointRequest) (*pb.LoadCheckpointResponse, error) {
	reason, err := fromprotoLoadReason(req.GetReason())
	if err != nil {
		return nil, invalidRequest("LoadCheckpoint", err)
	}
	res, err := s.impl.LoadCheckpoint(ctx, req.GetDir(), reason)
	if err != nil {
		return nil, statusError(err)
	}
	// A resume restores the checkpoint's parameters whatever the trainer
	// says; only a replacement's answer tells the host something.
	return &pb.LoadCheckpointResponse{StepCount: res.StepCount, CheckpointParams: res.CheckpointParams && reason == LoadReplacement}, nil
}

func (s *trainerServer) Shutdown(ctx context.Context, _ *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	if err := s.impl.Shutdown(ctx); err != nil {
		return nil, statusError(err)
	}
	return &pb.ShutdownResponse{}, nil
}

// trainerClient is the host's Trainer: every method is one call to the
// plugin's cohort.v1.Trainer service.
type trainerClient struct {
	rpc pb.TrainerClient
	// reasons: the negotiated protocol carries LoadCheckpoint's reason
	// (ProtocolLoadReason on); merges: Plan.ReportMerge
	// (ProtocolMergedReports on).
	reasons, merges bool
}

var (
	_ Trainer        = (*trainerClient)(nil)
	_ EpochEnder     = (*trainerClient)(nil)
	_ DeviceExporter = (*trainerClient)(nil)
	_ GroupedTrainer = (*trainerClient)(nil)
)

func (c *trainerClient) Describe(ctx context.Context) (Description, error) {
	resp, err := c.rpc.Describe(ctx, &pb.DescribeRequest{})
	if err != nil {
		return Description{}, callError(ctx, "Trainer.Describe", err)
	}
	return fromprotoDescription(resp), nil
}

func (c *trainerClient) Configure(ctx context.Context, cfg TrainerConfig) (TrainerSetup, error) {
	const op = "Trainer.Configure"
	resp, err := c.rpc.Configure(ctx, toprotoTrainerConfig(cfg))
	if err != nil {
		return TrainerSetup{}, callError(ctx, op, err)
	}
	setup, err := fromprotoTrainerSetup(resp)
	if err != nil {
		return TrainerSetup{}, invalidResponse(op, err)
	}
	return setup, nil
}

func (c *trainerClient) Attach(ctx context.Context, d arena.Descriptor) (bool, error) {
	const op = "Trainer.Attach"
	m, err := toprotoDescriptor(d)
	if err != nil {
		return false, errors.New(op + ": " + err.Error())
	}
	resp, err := c.rpc.Attach(ctx, &pb.AttachRequest{Arena: m})
	if err != nil {
		return false, callError(ctx, op, err)
	}
	return resp.GetZeroCopy(), nil
}

// Train reads the plugin's report stream until it ends. When report fails,
// the stream is cancelled (the plugin's Train sees its context done) and
// report's error is returned as is.
func (c *trainerClient) Train(ctx context.Context, plan Plan, report func(BatchReport) error) error {
	if report == nil {
		return c.TrainGrouped(ctx, plan, nil)
	}
	return c.TrainGrouped(ctx, plan, func(rs []BatchReport) error {
		for _, r := range rs {
			if err := report(r); err != nil {
				return err
			}
		}
		return nil
	})
}

// TrainGrouped is Train with report called once per message of the
// stream. From ProtocolMergedReports on the plan's ReportMerge goes to the
// plugin; an older plugin sends a message per report.
func (c *trainerClient) TrainGrouped(ctx context.Context, plan Plan, report func([]BatchReport) error) error {
	const op = "Trainer.Train"
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := toprotoPlan(plan)
	if !c.merges {
		req.ReportMergeMs = 0
	}
	stream, err := c.rpc.Train(streamCtx, req)
	if err != nil {
		return callError(ctx, op, err)
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return callError(ctx, op, err)
		}
		if report == nil || len(m.GetReports()) == 0 {
			continue
		}
		group := make([]BatchReport, 0, len(m.GetReports()))
		for _, r := range m.GetReports() {
			group = append(group, fromprotoBatchReport(r))
		}
		if err := report(group); err != nil {
			cancel()
			return err
		}
	}
}

func (c *trainerClient) Publish(ctx context.Context) (PublishResult, error) {
	resp, err := c.rpc.Publish(ctx, &pb.PublishRequest{})
	if err != nil {
		return PublishResult{}, callError(ctx, "Trainer.Publish", err)
	}
	return fromprotoPublishResult(resp), nil
}

func (c *trainerClient) Adopt(ctx context.Context, blendAlpha float64) (float64, error) {
	resp, err := c.rpc.Adopt(ctx, &pb.AdoptRequest{BlendAlpha: blendAlpha})
	if err != nil {
		return 0, callError(ctx, "Trainer.Adopt", err)
	}
	return resp.GetParamNorm(), nil
}

func (c *trainerClient) Evaluate(ctx context.Context) (EvalResult, error) {
	resp, err := c.rpc.Evaluate(ctx, &pb.EvaluateRequest{})
	if err != nil {
		return EvalResult{}, callError(ctx, "Trainer.Evaluate", err)
	}
	return fromprotoEvalResult(resp), nil
}

// EpochEnd runs the plugin's end-of-epoch code; a plugin built before the
// method existed has none.
func (c *trainerClient) EpochEnd(ctx context.Context, epoch uint64) (bool, error) {
	resp, err := c.rpc.EpochEnd(ctx, &pb.EpochEndRequest{Epoch: epoch})
	if status.Code(err) == codes.Unimplemented {
		return false, nil
	}
	if err != nil {
		return false, callError(ctx, "Trainer.EpochEnd", err)
	}
	return resp.GetRan(), nil
}

// ExportDevice asks the plugin for its GPU block; a plugin built before
// the method existed has none.
func (c *trainerClient) ExportDevice(ctx context.Context) (arena.DeviceBlock, bool, error) {
	resp, err := c.rpc.ExportDevice(ctx, &pb.ExportDeviceRequest{})
	if status.Code(err) == codes.Unimplemented {
		return arena.DeviceBlock{}, false, nil
	}
	if err != nil {
		return arena.DeviceBlock{}, false, callError(ctx, "Trainer.ExportDevice", err)
	}
	b, err := fromprotoDevice(resp.GetDevice())
	if err != nil || b == nil {
		return arena.DeviceBlock{}, false, err
	}
	return *b, true, nil
}

func (c *trainerClient) SaveCheckpoint(ctx context.Context, dir string) ([]string, error) {
	resp, err := c.rpc.SaveCheckpoint(ctx, &pb.SaveCheckpointRequest{Dir: dir})
	if err != nil {
		return nil, callError(ctx, "Trainer.SaveCheckpoint", err)
	}
	return resp.GetFiles(), nil
}

// LoadCheckpoint sends reason from ProtocolLoadReason on; a plugin of an
// older protocol gets none, treats the load as a resume and never answers
// CheckpointParams (KnowsLoadReason tells the host which it is).
func (c *trainerClient) LoadCheckpoint(ctx context.Context, dir string, reason LoadReason) (LoadResult, error) {
	const op = "Trainer.LoadCheckpoint"
	req := &pb.LoadCheckpointRequest{Dir: dir}
	if c.reasons {
		r, err := toprotoLoadReason(reason)
		if err != nil {
			return LoadResult{}, errors.New(op + ": " + err.Error())
		}
		req.Reason = r
	}
	resp, err := c.rpc.LoadCheckpoint(ctx, req)
	if err != nil {
		return LoadResult{}, callError(ctx, op, err)
	}
	return LoadResult{StepCount: resp.GetStepCount(), CheckpointParams: resp.GetCheckpointParams() && reason == LoadReplacement}, nil
}

// KnowsLoadReason reports whether t learns LoadCheckpoint's reason: a
// plugin process that negotiated ProtocolLoadReason or newer, or a trainer
// in this process. An older plugin loads every checkpoint as a resume,
// into the arena too if it trains there, so after a replacement's load the
// host puts the arena's newer values back itself.
func KnowsLoadReason(t Trainer) bool {
	c, ok := t.(*trainerClient)
	return !ok || c.reasons
}

func (c *trainerClient) Shutdown(ctx context.Context) error {
	_, err := c.rpc.Shutdown(ctx, &pb.ShutdownRequest{})
	return callError(ctx, "Trainer.Shutdown", err)
}
