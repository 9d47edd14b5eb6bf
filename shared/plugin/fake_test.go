package plugin

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// Test doubles: a trainer and an averager that hand every call to one
// function, and a connection between a gRPC server built as a plugin builds
// it and a client built as the host builds it.

// callFunc answers one call: method is the contract's method name, in the
// domain value it received (nil for methods without one).
type callFunc func(ctx context.Context, method string, in any) (any, error)

// recorder is a callFunc that records what it got and answers out, err.
type recorder struct {
	mu     sync.Mutex
	calls  int
	method string
	in     any
	out    any
	err    error
}

func (r *recorder) call(_ context.Context, method string, in any) (any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.method, r.in = method, in
	return r.out, r.err
}

func (r *recorder) answer(out any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out = out
}

func (r *recorder) got() (int, string, any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls, r.method, r.in
}

func as[T any](v any) T {
	t, _ := v.(T)
	return t
}

type fakeTrainer struct {
	call  callFunc
	train func(ctx context.Context, p Plan, report func(BatchReport) error) error
}

func (f *fakeTrainer) Describe(ctx context.Context) (Description, error) {
	out, err := f.call(ctx, "Describe", nil)
	return as[Description](out), err
}

func (f *fakeTrainer) Configure(ctx context.Context, cfg TrainerConfig) (TrainerSetup, error) {
	out, err := f.call(ctx, "Configure", cfg)
	return as[TrainerSetup](out), err
}

func (f *fakeTrainer) Attach(ctx context.Context, d arena.Descriptor) (bool, error) {
	out, err := f.call(ctx, "Attach", d)
	return as[bool](out), err
}

// deviceExport is ExportDevice's two results, as a round-trip case's value.
type deviceExport struct {
	B  arena.DeviceBlock
	OK bool
}

func (f *fakeTrainer) ExportDevice(ctx context.Context) (arena.DeviceBlock, bool, error) {
	out, err := f.call(ctx, "ExportDevice", nil)
	x := as[deviceExport](out)
	return x.B, x.OK, err
}

func (f *fakeTrainer) Train(ctx context.Context, p Plan, report func(BatchReport) error) error {
	return f.train(ctx, p, report)
}

func (f *fakeTrainer) Publish(ctx context.Context) (PublishResult, error) {
	out, err := f.call(ctx, "Publish", nil)
	return as[PublishResult](out), err
}

func (f *fakeTrainer) Adopt(ctx context.Context, blendAlpha float64) (float64, error) {
	out, err := f.call(ctx, "Adopt", blendAlpha)
	return as[float64](out), err
}

func (f *fakeTrainer) Evaluate(ctx context.Context) (EvalResult, error) {
	out, err := f.call(ctx, "Evaluate", nil)
	return as[EvalResult](out), err
}

func (f *fakeTrainer) SaveCheckpoint(ctx context.Context, dir string) ([]string, error) {
	out, err := f.call(ctx, "SaveCheckpoint", dir)
	return as[[]string](out), err
}

// loadIn is what LoadCheckpoint received.
type loadIn struct {
	Dir    string
	Reason LoadReason
}

func (f *fakeTrainer) LoadCheckpoint(ctx context.Context, dir string, reason LoadReason) (LoadResult, error) {
	out, err := f.call(ctx, "LoadCheckpoint", loadIn{dir, reason})
	return as[LoadResult](out), err
}

func (f *fakeTrainer) Shutdown(ctx context.Context) error {
	_, err := f.call(ctx, "Shutdown", nil)
	return err
}

type fakeAverager struct {
	call callFunc
}

func (f *fakeAverager) Describe(ctx context.Context) (Description, error) {
	out, err := f.call(ctx, "Describe", nil)
	return as[Description](out), err
}

func (f *fakeAverager) Configure(ctx context.Context, cfg AveragerConfig) (AveragerTraits, error) {
	out, err := f.call(ctx, "Configure", cfg)
	return as[AveragerTraits](out), err
}

func (f *fakeAverager) Average(ctx context.Context, r Round) (RoundResult, error) {
	out, err := f.call(ctx, "Average", r)
	return as[RoundResult](out), err
}

func (f *fakeAverager) NewSessionID(ctx context.Context) ([]byte, error) {
	out, err := f.call(ctx, "NewSessionID", nil)
	return as[[]byte](out), err
}

func (f *fakeAverager) NewSession(ctx context.Context, s Session) error {
	_, err := f.call(ctx, "NewSession", s)
	return err
}

func (f *fakeAverager) Abort(ctx context.Context, reason string) error {
	_, err := f.call(ctx, "Abort", reason)
	return err
}

func (f *fakeAverager) SaveState(ctx context.Context, dir string) ([]string, error) {
	out, err := f.call(ctx, "SaveState", dir)
	return as[[]string](out), err
}

func (f *fakeAverager) LoadState(ctx context.Context, dir string) error {
	_, err := f.call(ctx, "LoadState", dir)
	return err
}

func (f *fakeAverager) Shutdown(ctx context.Context) error {
	_, err := f.call(ctx, "Shutdown", nil)
	return err
}

// connect serves plugins on a server made by newServer over an in-memory
// listener and returns a client connection with the given dial options.
func connect(t *testing.T, newServer func([]grpc.ServerOption) *grpc.Server, dial []grpc.DialOption, plugins ...goplugin.GRPCPlugin) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := newServer(nil)
	for _, p := range plugins {
		if err := p.GRPCServer(nil, s); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = s.Serve(lis) }()
	opts := append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, dial...)
	conn, err := grpc.NewClient("passthrough:///plugin", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		s.Stop()
	})
	return conn
}

// serveTrainer connects a host-side Trainer to impl as Serve and
// ClientConfig would configure the two ends.
func serveTrainer(t *testing.T, impl Trainer) Trainer {
	t.Helper()
	conn := connect(t, newGRPCServer, dialOptions(), TrainerPlugin{Impl: impl})
	raw, err := TrainerPlugin{}.GRPCClient(context.Background(), nil, conn)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(Trainer)
}

// serveAverager is serveTrainer for an averager.
func serveAverager(t *testing.T, impl Averager) Averager {
	t.Helper()
	conn := connect(t, newGRPCServer, dialOptions(), AveragerPlugin{Impl: impl})
	raw, err := AveragerPlugin{}.GRPCClient(context.Background(), nil, conn)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(Averager)
}

func ptr(f float64) *float64 { return &f }

// testLayout packs one tensor of every dtype and both roles, including a
// scalar.
func testLayout(t testing.TB) arena.Layout {
	t.Helper()
	l, err := arena.Pack([]arena.Entry{
		{Name: "fc1.weight", DType: arena.F32, Shape: []int64{128, 784}, Role: arena.Parameter},
		{Name: "fc1.bias", DType: arena.F64, Shape: []int64{128}, Role: arena.Parameter},
		{Name: "emb.weight", DType: arena.BF16, Shape: []int64{3, 5, 7}, Role: arena.Parameter},
		{Name: "head.weight", DType: arena.F16, Shape: []int64{10, 128}, Role: arena.Parameter},
		{Name: "bn.num_batches_tracked", DType: arena.I64, Role: arena.Buffer},
		{Name: "bn.counts", DType: arena.I32, Shape: []int64{0}, Role: arena.Buffer},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
