package plugin

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
)

// Conversions between the domain types of contract.go and the generated
// protobuf messages. toproto* builds a message for the wire; fromproto*
// reads one that came off it. Anything read from the wire is untrusted:
// enum values outside the contract are errors, every layout is validated,
// and a missing message that the contract requires is an error. Nothing
// here panics on a nil message; the generated getters tolerate nil.
//
// proto3 does not tell an empty byte or list field from an absent one, so
// empty slices (settings, data key, session id, members, capabilities,
// files, layout entries, a scalar's shape) arrive as nil.

func toprotoDescription(d Description) *pb.PluginDescription {
	m := &pb.PluginDescription{Name: d.Name, Version: d.Version, Capabilities: d.Capabilities, Meeting: d.Meeting,
		SettingsDeclared: d.Settings != nil}
	for _, s := range d.Settings {
		m.Settings = append(m.Settings, &pb.SettingSpec{Key: s.Key, Type: string(s.Type), Required: s.Required, Doc: s.Doc})
	}
	return m
}

func fromprotoDescription(m *pb.PluginDescription) Description {
	d := Description{Name: m.GetName(), Version: m.GetVersion(), Capabilities: m.GetCapabilities(), Meeting: m.GetMeeting()}
	if m.GetSettingsDeclared() {
		d.Settings = make([]SettingSpec, 0, len(m.GetSettings()))
		for _, s := range m.GetSettings() {
			d.Settings = append(d.Settings, SettingSpec{Key: s.GetKey(), Type: SettingType(s.GetType()), Required: s.GetRequired(), Doc: s.GetDoc()})
		}
	}
	return d
}

func toprotoDType(d arena.DType) (pb.DType, error) {
	switch d {
	case arena.F32:
		return pb.DType_DTYPE_F32, nil
	case arena.F64:
		return pb.DType_DTYPE_F64, nil
	case arena.BF16:
		return pb.DType_DTYPE_BF16, nil
	case arena.F16:
		return pb.DType_DTYPE_F16, nil
	case arena.I64:
		return pb.DType_DTYPE_I64, nil
	case arena.I32:
		return pb.DType_DTYPE_I32, nil
	}
	return pb.DType_DTYPE_UNSPECIFIED, fmt.Errorf("unknown %v", d)
}

func fromprotoDType(d pb.DType) (arena.DType, error) {
	switch d {
	case pb.DType_DTYPE_F32:
		return arena.F32, nil
	case pb.DType_DTYPE_F64:
		return arena.F64, nil
	case pb.DType_DTYPE_BF16:
		return arena.BF16, nil
	case pb.DType_DTYPE_F16:
		return arena.F16, nil
	case pb.DType_DTYPE_I64:
		return arena.I64, nil
	case pb.DType_DTYPE_I32:
		return arena.I32, nil
	}
	return 0, fmt.Errorf("unknown dtype %d", int32(d))
}

func toprotoRole(r arena.Role) (pb.TensorRole, error) {
	switch r {
	case arena.Parameter:
		return pb.TensorRole_TENSOR_ROLE_PARAMETER, nil
	case arena.Buffer:
		return pb.TensorRole_TENSOR_ROLE_BUFFER, nil
	}
	return pb.TensorRole_TENSOR_ROLE_UNSPECIFIED, fmt.Errorf("unknown %v", r)
}

func fromprotoRole(r pb.TensorRole) (arena.Role, error) {
	switch r {
	case pb.TensorRole_TENSOR_ROLE_PARAMETER:
		return arena.Parameter, nil
	case pb.TensorRole_TENSOR_ROLE_BUFFER:
		return arena.Buffer, nil
	}
	return 0, fmt.Errorf("unknown tensor role %d", int32(r))
}

// toprotoLayout refuses entries whose dtype or role has no wire value; the
// receiver validates the rest.
func toprotoLayout(l arena.Layout) (*pb.Layout, error) {
	entries := make([]*pb.TensorEntry, len(l.Entries))
	for i, e := range l.Entries {
		dt, err := toprotoDType(e.DType)
		if err != nil {
			return nil, fmt.Errorf("layout entry %d (%q): %w", i, e.Name, err)
		}
		role, err := toprotoRole(e.Role)
		if err != nil {
			return nil, fmt.Errorf("layout entry %d (%q): %w", i, e.Name, err)
		}
		entries[i] = &pb.TensorEntry{
			Name:   e.Name,
			Dtype:  dt,
			Shape:  e.Shape,
			Offset: e.Offset,
			Nbytes: e.Bytes,
			Role:   role,
		}
	}
	return &pb.Layout{Entries: entries, Size: l.Size}, nil
}

// fromprotoLayout converts a layout off the wire and validates it: a layout
// that reaches domain code is always one arena.Layout.Validate accepts.
func fromprotoLayout(m *pb.Layout) (arena.Layout, error) {
	if m == nil {
		return arena.Layout{}, fmt.Errorf("no layout")
	}
	var entries []arena.Entry
	if len(m.Entries) > 0 {
		entries = make([]arena.Entry, len(m.Entries))
	}
	for i, e := range m.Entries {
		if e == nil {
			return arena.Layout{}, fmt.Errorf("layout entry %d: empty", i)
		}
		dt, err := fromprotoDType(e.Dtype)
		if err != nil {
			return arena.Layout{}, fmt.Errorf("layout entry %d (%q): %w", i, e.Name, err)
		}
		role, err := fromprotoRole(e.Role)
		if err != nil {
			return arena.Layout{}, fmt.Errorf("layout entry %d (%q): %w", i, e.Name, err)
		}
		entries[i] = arena.Entry{
			Name:   e.Name,
			DType:  dt,
			Shape:  e.Shape,
			Offset: e.Offset,
			Bytes:  e.Nbytes,
			Role:   role,
		}
	}
	l := arena.Layout{Entries: entries, Size: m.Size}
	if err := l.Validate(); err != nil {
		return arena.Layout{}, fmt.Errorf("invalid layout: %w", err)
	}
	return l, nil
}

func toprotoDescriptor(d arena.Descriptor) (*pb.ArenaDescriptor, error) {
	l, err := toprotoLayout(d.Layout)
	if err != nil {
		return nil, err
	}
	return &pb.ArenaDescriptor{Path: d.Path, Layout: l, Device: toprotoDevice(d.Device)}, nil
}

func toprotoDevice(b *arena.DeviceBlock) *pb.DeviceBlock {
	if b == nil {
		return nil
	}
	return &pb.DeviceBlock{Gpu: b.GPU, Handle: b.Handle[:], Size: b.Size}
}

func fromprotoDevice(m *pb.DeviceBlock) (*arena.DeviceBlock, error) {
	if m == nil {
		return nil, nil
	}
	b := &arena.DeviceBlock{GPU: m.Gpu, Size: m.Size}
	if len(m.Handle) != len(b.Handle) {
		return nil, fmt.Errorf("device block handle of %d bytes, not %d", len(m.Handle), len(b.Handle))
	}
	copy(b.Handle[:], m.Handle)
	return b, nil
}

func fromprotoDescriptor(m *pb.ArenaDescriptor) (arena.Descriptor, error) {
	if m == nil {
		return arena.Descriptor{}, fmt.Errorf("no arena descriptor")
	}
	if m.Path == "" {
		return arena.Descriptor{}, fmt.Errorf("arena descriptor without a path")
	}
	l, err := fromprotoLayout(m.Layout)
	if err != nil {
		return arena.Descriptor{}, fmt.Errorf("arena %s: %w", m.Path, err)
	}
	d := arena.Descriptor{Path: m.Path, Layout: l}
	if d.Device, err = fromprotoDevice(m.Device); err != nil {
		return arena.Descriptor{}, fmt.Errorf("arena %s: %w", m.Path, err)
	}
	if d.Device != nil {
		if err := l.CheckDevice(*d.Device); err != nil {
			return arena.Descriptor{}, fmt.Errorf("arena %s: %w", m.Path, err)
		}
	}
	return d, nil
}

func settings(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	return json.RawMessage(b)
}

// copyFloat keeps an optional value optional without sharing the pointer
// between a message and a domain value.
func copyFloat(p *float64) *float64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// Trainer messages.

func toprotoTrainerConfig(c TrainerConfig) *pb.TrainerConfigureRequest {
	return &pb.TrainerConfigureRequest{
		Rank:          c.Rank,
		WorldSize:     c.WorldSize,
		LocalRanks:    c.LocalRanks,
		Seed:          c.Seed,
		SettingsJson:  c.Settings,
		OverlapRounds: c.OverlapRounds,
	}
}

func fromprotoTrainerConfig(m *pb.TrainerConfigureRequest) TrainerConfig {
	return TrainerConfig{
		Rank:          m.GetRank(),
		WorldSize:     m.GetWorldSize(),
		LocalRanks:    m.GetLocalRanks(),
		Seed:          m.GetSeed(),
		Settings:      settings(m.GetSettingsJson()),
		OverlapRounds: m.GetOverlapRounds(),
	}
}

func toprotoTrainerSetup(s TrainerSetup) (*pb.TrainerConfigureResponse, error) {
	l, err := toprotoLayout(s.Layout)
	if err != nil {
		return nil, err
	}
	return &pb.TrainerConfigureResponse{
		Layout:            l,
		Samples:           s.Samples,
		EvalSamples:       s.EvalSamples,
		BatchSize:         s.BatchSize,
		AdaptiveOptimizer: s.AdaptiveOptimizer,
	}, nil
}

func fromprotoTrainerSetup(m *pb.TrainerConfigureResponse) (TrainerSetup, error) {
	l, err := fromprotoLayout(m.GetLayout())
	if err != nil {
		return TrainerSetup{}, err
	}
	return TrainerSetup{
		Layout:            l,
		Samples:           m.GetSamples(),
		EvalSamples:       m.GetEvalSamples(),
		BatchSize:         m.GetBatchSize(),
		AdaptiveOptimizer: m.GetAdaptiveOptimizer(),
	}, nil
}

func toprotoPlan(p Plan) *pb.TrainRequest {
	return &pb.TrainRequest{
		Epoch:           p.Epoch,
		PartitionOffset: p.PartitionOffset,
		PartitionSize:   p.PartitionSize,
		Seed:            p.Seed,
		PickSpace:       p.PickSpace,
		GlobalStep:      p.GlobalStep,
		LrScale:         p.LRScale,
		ReportMergeMs:   reportMergeMS(p.ReportMerge),
	}
}

// reportMergeMS is d as TrainRequest.report_merge_ms: whole milliseconds,
// at least 1 for any d above 0 (0 would ask for no merging), saturating.
func reportMergeMS(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(max(d/time.Millisecond, 1), math.MaxUint32))
}

func fromprotoPlan(m *pb.TrainRequest) Plan {
	return Plan{
		Epoch:           m.GetEpoch(),
		PartitionOffset: m.GetPartitionOffset(),
		PartitionSize:   m.GetPartitionSize(),
		Seed:            m.GetSeed(),
		PickSpace:       m.GetPickSpace(),
		GlobalStep:      m.GetGlobalStep(),
		LRScale:         m.GetLrScale(),
		ReportMerge:     time.Duration(m.GetReportMergeMs()) * time.Millisecond,
	}
}

func toprotoBatchReport(r BatchReport) *pb.BatchReport {
	return &pb.BatchReport{
		Batch:       r.Batch,
		Samples:     r.Samples,
		Loss:        r.Loss,
		BatchMs:     r.BatchMS,
		DataMs:      r.DataMS,
		StepCount:   r.StepCount,
		ParamNorm:   copyFloat(r.ParamNorm),
		Scalars:     r.Scalars,
		RoundWaitMs: r.RoundWaitMS,
	}
}

func fromprotoBatchReport(m *pb.BatchReport) BatchReport {
	r := BatchReport{
		Batch:       m.GetBatch(),
		Samples:     m.GetSamples(),
		Loss:        m.GetLoss(),
		BatchMS:     m.GetBatchMs(),
		DataMS:      m.GetDataMs(),
		StepCount:   m.GetStepCount(),
		Scalars:     m.GetScalars(),
		RoundWaitMS: m.GetRoundWaitMs(),
	}
	if m != nil {
		r.ParamNorm = copyFloat(m.ParamNorm)
	}
	return r
}

func toprotoPublishResult(r PublishResult) *pb.PublishResponse {
	return &pb.PublishResponse{Steps: r.Steps, StepCount: r.StepCount, ParamNorm: r.ParamNorm, HostCopyBytes: r.HostCopyBytes}
}

func fromprotoPublishResult(m *pb.PublishResponse) PublishResult {
	return PublishResult{Steps: m.GetSteps(), StepCount: m.GetStepCount(), ParamNorm: m.GetParamNorm(), HostCopyBytes: m.GetHostCopyBytes()}
}

func toprotoEvalResult(r EvalResult) *pb.EvaluateResponse {
	return &pb.EvaluateResponse{Loss: r.Loss, Accuracy: copyFloat(r.Accuracy), Samples: r.Samples}
}

func fromprotoEvalResult(m *pb.EvaluateResponse) EvalResult {
	r := EvalResult{Loss: m.GetLoss(), Samples: m.GetSamples()}
	if m != nil {
		r.Accuracy = copyFloat(m.Accuracy)
	}
	return r
}

// Averager messages.

func toprotoAveragerConfig(c AveragerConfig) (*pb.AveragerConfigureRequest, error) {
	d, err := toprotoDescriptor(c.Arena)
	if err != nil {
		return nil, err
	}
	return &pb.AveragerConfigureRequest{
		Rank:         c.Rank,
		WorldSize:    c.WorldSize,
		Arena:        d,
		Endpoint:     c.Endpoint,
		DataKey:      c.DataKey,
		SettingsJson: c.Settings,
		RunId:        c.RunID,
		Tls:          toprotoTLS(c.TLS),
	}, nil
}

func toprotoTLS(f *TLSFiles) *pb.TLSFiles {
	if f == nil {
		return nil
	}
	return &pb.TLSFiles{Ca: f.CA, Cert: f.Cert, Key: f.Key}
}

func fromprotoAveragerConfig(m *pb.AveragerConfigureRequest) (AveragerConfig, error) {
	d, err := fromprotoDescriptor(m.GetArena())
	if err != nil {
		return AveragerConfig{}, err
	}
	c := AveragerConfig{
		Rank:      m.GetRank(),
		WorldSize: m.GetWorldSize(),
		Arena:     d,
		Endpoint:  m.GetEndpoint(),
		Settings:  settings(m.GetSettingsJson()),
		RunID:     m.GetRunId(),
	}
	if k := m.GetDataKey(); len(k) > 0 {
		c.DataKey = k
	}
	if t := m.GetTls(); t != nil {
		c.TLS = &TLSFiles{CA: t.GetCa(), Cert: t.GetCert(), Key: t.GetKey()}
	}
	return c, nil
}

func toprotoRound(r Round) *pb.AverageRequest {
	return &pb.AverageRequest{Round: r.Round, Steps: r.Steps, Broadcast: r.Broadcast, Root: r.Root}
}

func fromprotoRound(m *pb.AverageRequest) Round {
	return Round{Round: m.GetRound(), Steps: m.GetSteps(), Broadcast: m.GetBroadcast(), Root: m.GetRoot()}
}

func toprotoRoundResult(r RoundResult) *pb.AverageResponse {
	return &pb.AverageResponse{
		Weight:        r.Weight,
		TotalWeight:   r.TotalWeight,
		Divergence:    r.Divergence,
		PreNorm:       r.PreNorm,
		PostNorm:      r.PostNorm,
		BytesMoved:    r.BytesMoved,
		ReduceMs:      r.ReduceMS,
		WaitMs:        r.WaitMS,
		TotalMs:       r.TotalMS,
		Realized:      r.Realized,
		HostCopyBytes: r.HostCopyBytes,
	}
}

func fromprotoRoundResult(m *pb.AverageResponse) RoundResult {
	return RoundResult{
		Weight:        m.GetWeight(),
		TotalWeight:   m.GetTotalWeight(),
		Divergence:    m.GetDivergence(),
		PreNorm:       m.GetPreNorm(),
		PostNorm:      m.GetPostNorm(),
		BytesMoved:    m.GetBytesMoved(),
		ReduceMS:      m.GetReduceMs(),
		WaitMS:        m.GetWaitMs(),
		TotalMS:       m.GetTotalMs(),
		Realized:      m.GetRealized(),
		HostCopyBytes: m.GetHostCopyBytes(),
	}
}

func toprotoSession(s Session) *pb.NewSessionRequest {
	return &pb.NewSessionRequest{
		Generation:   s.Generation,
		SessionId:    s.ID,
		NewRank:      s.NewRank,
		NewWorldSize: s.NewWorldSize,
		Members:      s.Members,
	}
}

func fromprotoSession(m *pb.NewSessionRequest) Session {
	s := Session{
		Generation:   m.GetGeneration(),
		NewRank:      m.GetNewRank(),
		NewWorldSize: m.GetNewWorldSize(),
	}
	if id := m.GetSessionId(); len(id) > 0 {
		s.ID = id
	}
	if mem := m.GetMembers(); len(mem) > 0 {
		s.Members = mem
	}
	return s
}

func toprotoLoadReason(r LoadReason) (pb.LoadReason, error) {
	switch r {
	case LoadResume:
		return pb.LoadReason_LOAD_REASON_RESUME, nil
	case LoadReplacement:
		return pb.LoadReason_LOAD_REASON_REPLACEMENT, nil
	}
	return 0, fmt.Errorf("load reason %v is neither a resume nor a replacement", r)
}

// fromprotoLoadReason reads a request's reason; a host before
// ProtocolLoadReason sends none, which is a resume.
func fromprotoLoadReason(r pb.LoadReason) (LoadReason, error) {
	switch r {
	case pb.LoadReason_LOAD_REASON_UNSPECIFIED, pb.LoadReason_LOAD_REASON_RESUME:
		return LoadResume, nil
	case pb.LoadReason_LOAD_REASON_REPLACEMENT:
		return LoadReplacement, nil
	}
	return 0, fmt.Errorf("unknown load reason %d", int32(r))
}
