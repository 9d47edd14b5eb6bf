package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcCase is one call through the adapters: invoke calls the host-side
// interface with in; the fake plugin must receive exactly in (as method)
// and the host must get back exactly out.
type rpcCase[C any] struct {
	name   string
	op     string // Service.Method, as errors name it
	method string // the contract method the fake sees
	in     any
	out    any
	invoke func(ctx context.Context, c C, in any) (any, error)
}

func runRPCCases[C any](t *testing.T, cases []rpcCase[C], client func(t *testing.T, rec *recorder) C) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{out: tc.out}
			c := client(t, rec)
			out, err := tc.invoke(context.Background(), c, tc.in)
			if err != nil {
				t.Fatalf("%s: %v", tc.op, err)
			}
			calls, method, in := rec.got()
			if calls != 1 || method != tc.method {
				t.Fatalf("plugin saw %d calls, last %q; want one %q", calls, method, tc.method)
			}
			if !reflect.DeepEqual(in, tc.in) {
				t.Errorf("plugin received\n%#v\nwant\n%#v", in, tc.in)
			}
			if !reflect.DeepEqual(out, tc.out) {
				t.Errorf("host received\n%#v\nwant\n%#v", out, tc.out)
			}
		})
		t.Run(tc.name+"/error", func(t *testing.T) {
			msg := `plugin says: "` + tc.method + `" failed; details: ünïcode, 100%`
			rec := &recorder{out: tc.out, err: errors.New(msg)}
			c := client(t, rec)
			_, err := tc.invoke(context.Background(), c, tc.in)
			if err == nil {
				t.Fatalf("%s: no error; the plugin failed", tc.op)
			}
			if want := tc.op + ": " + msg; err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			if code := status.Code(err); code != codes.Unknown {
				t.Errorf("status code %v, want %v", code, codes.Unknown)
			}
		})
	}
}

func TestTrainerRoundTrip(t *testing.T) {
	layout := testLayout(t)
	cases := []rpcCase[Trainer]{
		{
			name: "Describe", op: "Trainer.Describe", method: "Describe",
			out:    Description{Name: "libtorch", Version: "0.3.1+cu124", Capabilities: []string{"cuda", "torchscript"}},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Describe(ctx) },
		},
		{
			name: "Describe/zero", op: "Trainer.Describe", method: "Describe",
			out:    Description{},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Describe(ctx) },
		},
		{
			name: "Describe/settings schema", op: "Trainer.Describe", method: "Describe",
			out: Description{Name: "libtorch", Settings: []SettingSpec{
				{Key: "lr", Type: SettingNumber, Doc: "learning rate"},
				{Key: "data", Type: SettingString, Required: true},
				{Key: "timeout", Type: SettingDuration},
			}},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Describe(ctx) },
		},
		{
			// Empty is not nil: the plugin takes no settings, and the core
			// refuses any.
			name: "Describe/empty settings schema", op: "Trainer.Describe", method: "Describe",
			out:    Description{Name: "plain", Settings: []SettingSpec{}},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Describe(ctx) },
		},
		{
			name: "Configure", op: "Trainer.Configure", method: "Configure",
			in: TrainerConfig{Rank: 3, WorldSize: 8, LocalRanks: 2, Seed: math.MaxUint64,
				Settings: json.RawMessage(`{"model":"mlp","lr":0.05,"layers":[784,128,10]}`)},
			out:    TrainerSetup{Layout: layout, Samples: 60000, EvalSamples: 10000, BatchSize: 64},
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.Configure(ctx, in.(TrainerConfig)) },
		},
		{
			name: "Configure/no settings, empty layout", op: "Trainer.Configure", method: "Configure",
			in:     TrainerConfig{WorldSize: 1},
			out:    TrainerSetup{},
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.Configure(ctx, in.(TrainerConfig)) },
		},
		{
			name: "Attach/zero copy", op: "Trainer.Attach", method: "Attach",
			in:     arena.Descriptor{Path: "/dev/shm/cohort-run1-rank3", Layout: layout},
			out:    true,
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.Attach(ctx, in.(arena.Descriptor)) },
		},
		{
			name: "Attach/copy", op: "Trainer.Attach", method: "Attach",
			in:     arena.Descriptor{Path: "/dev/shm/x", Layout: arena.Layout{Size: 4096}},
			out:    false,
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.Attach(ctx, in.(arena.Descriptor)) },
		},
		{
			name: "ExportDevice", op: "Trainer.ExportDevice", method: "ExportDevice",
			out: deviceExport{B: arena.DeviceBlock{GPU: "boot/0000:3b:00.0", Handle: [64]byte{7, 63: 1}, Size: 4096}, OK: true},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) {
				b, ok, err := c.(DeviceExporter).ExportDevice(ctx)
				return deviceExport{b, ok}, err
			},
		},
		{
			name: "ExportDevice/none", op: "Trainer.ExportDevice", method: "ExportDevice",
			out: deviceExport{},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) {
				b, ok, err := c.(DeviceExporter).ExportDevice(ctx)
				return deviceExport{b, ok}, err
			},
		},
		{
			name: "Publish", op: "Trainer.Publish", method: "Publish",
			out:    PublishResult{Steps: 50, StepCount: math.MaxUint64, ParamNorm: 123.456, HostCopyBytes: 5 << 30},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Publish(ctx) },
		},
		{
			name: "Adopt/blend", op: "Trainer.Adopt", method: "Adopt",
			in: 0.25, out: -0.0078125,
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.Adopt(ctx, in.(float64)) },
		},
		{
			name: "Adopt/overwrite", op: "Trainer.Adopt", method: "Adopt",
			in: 0.0, out: math.MaxFloat64,
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.Adopt(ctx, in.(float64)) },
		},
		{
			name: "Evaluate/accuracy", op: "Trainer.Evaluate", method: "Evaluate",
			out:    EvalResult{Loss: 0.3125, Accuracy: ptr(0.875), Samples: 10000},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Evaluate(ctx) },
		},
		{
			name: "Evaluate/accuracy zero is set", op: "Trainer.Evaluate", method: "Evaluate",
			out:    EvalResult{Loss: 2.3, Accuracy: ptr(0), Samples: 1},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Evaluate(ctx) },
		},
		{
			name: "Evaluate/no accuracy", op: "Trainer.Evaluate", method: "Evaluate",
			out:    EvalResult{Loss: 1.5, Samples: 10000},
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return c.Evaluate(ctx) },
		},
		{
			name: "SaveCheckpoint", op: "Trainer.SaveCheckpoint", method: "SaveCheckpoint",
			in:     "/ckpt/epoch-3",
			out:    []string{"/ckpt/epoch-3/model.pt", "/ckpt/epoch-3/optim.pt"},
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.SaveCheckpoint(ctx, in.(string)) },
		},
		{
			name: "SaveCheckpoint/no files", op: "Trainer.SaveCheckpoint", method: "SaveCheckpoint",
			in:     "",
			out:    []string(nil),
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) { return c.SaveCheckpoint(ctx, in.(string)) },
		},
		{
			name: "LoadCheckpoint/resume", op: "Trainer.LoadCheckpoint", method: "LoadCheckpoint",
			in: loadIn{"/ckpt/epoch-3", LoadResume}, out: LoadResult{StepCount: 1 << 40},
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) {
				return c.LoadCheckpoint(ctx, in.(loadIn).Dir, in.(loadIn).Reason)
			},
		},
		{
			name: "LoadCheckpoint/replacement", op: "Trainer.LoadCheckpoint", method: "LoadCheckpoint",
			in: loadIn{"/ckpt/epoch-3/rank-1", LoadReplacement}, out: LoadResult{StepCount: 7},
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) {
				return c.LoadCheckpoint(ctx, in.(loadIn).Dir, in.(loadIn).Reason)
			},
		},
		{
			name: "LoadCheckpoint/replacement keeps the checkpoint's", op: "Trainer.LoadCheckpoint", method: "LoadCheckpoint",
			in: loadIn{"/ckpt/epoch-3/rank-1", LoadReplacement}, out: LoadResult{StepCount: 7, CheckpointParams: true},
			invoke: func(ctx context.Context, c Trainer, in any) (any, error) {
				return c.LoadCheckpoint(ctx, in.(loadIn).Dir, in.(loadIn).Reason)
			},
		},
		{
			name: "Shutdown", op: "Trainer.Shutdown", method: "Shutdown",
			invoke: func(ctx context.Context, c Trainer, _ any) (any, error) { return nil, c.Shutdown(ctx) },
		},
	}
	runRPCCases(t, cases, func(t *testing.T, rec *recorder) Trainer {
		return serveTrainer(t, &fakeTrainer{call: rec.call})
	})
}

func TestAveragerRoundTrip(t *testing.T) {
	layout := testLayout(t)
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(255 - i*8)
	}
	cases := []rpcCase[Averager]{
		{
			name: "Describe", op: "Averager.Describe", method: "Describe",
			out: Description{Name: "nccl", Version: "2.21", Capabilities: []string{"cuda", "bf16-wire"},
				Settings: []SettingSpec{{Key: "gamma", Type: SettingNumber}, {Key: "hosts", Type: SettingArray, Required: true}}},
			invoke: func(ctx context.Context, c Averager, _ any) (any, error) { return c.Describe(ctx) },
		},
		{
			name: "Configure", op: "Averager.Configure", method: "Configure",
			in: AveragerConfig{
				Rank: 1, WorldSize: 4,
				Arena:    arena.Descriptor{Path: "/dev/shm/cohort-run1-rank1", Layout: layout},
				Endpoint: "10.0.0.7:29500", DataKey: key,
				Settings: json.RawMessage(`{"gamma":1.0,"wire":"bf16"}`),
				RunID:    "run-2024-06-01T12:00:00Z",
				TLS:      &TLSFiles{CA: "/etc/cohort/ca.pem", Cert: "/etc/cohort/n1.pem", Key: "/etc/cohort/n1-key.pem"},
			},
			out: AveragerTraits{SoloIdentity: true},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return c.Configure(ctx, in.(AveragerConfig))
			},
		},
		{
			name: "Configure/device block", op: "Averager.Configure", method: "Configure",
			in: AveragerConfig{WorldSize: 2, Arena: arena.Descriptor{Path: "/dev/shm/a", Layout: layout,
				Device: &arena.DeviceBlock{GPU: "boot/0000:3b:00.0", Handle: [64]byte{1, 2, 63: 9}, Size: layout.DeviceBytes()}}},
			out: AveragerTraits{},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return c.Configure(ctx, in.(AveragerConfig))
			},
		},
		{
			name: "Configure/minimal", op: "Averager.Configure", method: "Configure",
			in:  AveragerConfig{WorldSize: 1, Arena: arena.Descriptor{Path: "/dev/shm/a"}},
			out: AveragerTraits{},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return c.Configure(ctx, in.(AveragerConfig))
			},
		},
		{
			name: "Average", op: "Averager.Average", method: "Average",
			in: Round{Round: 7, Steps: 50, Broadcast: true, Root: 2},
			out: RoundResult{Weight: 50, TotalWeight: 197, Divergence: 0.0123, PreNorm: 41.5, PostNorm: 41.25,
				BytesMoved: 3 << 30, ReduceMS: 12.5, WaitMS: 3.25, TotalMS: 16, Realized: true, HostCopyBytes: 6 << 30},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) { return c.Average(ctx, in.(Round)) },
		},
		{
			name: "Average/not realized", op: "Averager.Average", method: "Average",
			in: Round{}, out: RoundResult{},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) { return c.Average(ctx, in.(Round)) },
		},
		{
			name: "NewSessionID", op: "Averager.NewSessionID", method: "NewSessionID",
			out:    []byte{0, 1, 2, 0x7f, 0x80, 0xff, 0},
			invoke: func(ctx context.Context, c Averager, _ any) (any, error) { return c.NewSessionID(ctx) },
		},
		{
			name: "NewSessionID/empty", op: "Averager.NewSessionID", method: "NewSessionID",
			out:    []byte(nil),
			invoke: func(ctx context.Context, c Averager, _ any) (any, error) { return c.NewSessionID(ctx) },
		},
		{
			name: "NewSession", op: "Averager.NewSession", method: "NewSession",
			in: Session{Generation: 3, ID: []byte{9, 0, 8}, NewRank: 1, NewWorldSize: 3, Members: []uint32{0, 2, 3}},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return nil, c.NewSession(ctx, in.(Session))
			},
		},
		{
			name: "NewSession/zero", op: "Averager.NewSession", method: "NewSession",
			in: Session{},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return nil, c.NewSession(ctx, in.(Session))
			},
		},
		{
			name: "Abort", op: "Averager.Abort", method: "Abort",
			in: "rank 2 declared dead: heartbeat timeout",
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return nil, c.Abort(ctx, in.(string))
			},
		},
		{
			name: "SaveState", op: "Averager.SaveState", method: "SaveState",
			in:     "/ckpt/epoch-3/rank-1",
			out:    []string{"/ckpt/epoch-3/rank-1/outer.bin"},
			invoke: func(ctx context.Context, c Averager, in any) (any, error) { return c.SaveState(ctx, in.(string)) },
		},
		{
			name: "SaveState/stateless", op: "Averager.SaveState", method: "SaveState",
			in:     "/ckpt/epoch-3/rank-1",
			out:    []string(nil),
			invoke: func(ctx context.Context, c Averager, in any) (any, error) { return c.SaveState(ctx, in.(string)) },
		},
		{
			name: "LoadState", op: "Averager.LoadState", method: "LoadState",
			in: "/ckpt/epoch-3/rank-1",
			invoke: func(ctx context.Context, c Averager, in any) (any, error) {
				return nil, c.LoadState(ctx, in.(string))
			},
		},
		{
			name: "Shutdown", op: "Averager.Shutdown", method: "Shutdown",
			invoke: func(ctx context.Context, c Averager, _ any) (any, error) { return nil, c.Shutdown(ctx) },
		},
	}
	runRPCCases(t, cases, func(t *testing.T, rec *recorder) Averager {
		return serveAverager(t, &fakeAverager{call: rec.call})
	})
}

func TestTrainStreamsReports(t *testing.T) {
	plan := Plan{Epoch: 2, PartitionOffset: 15000, PartitionSize: 7500, Seed: 42, PickSpace: 60000, GlobalStep: math.MaxUint64}
	reports := []BatchReport{
		{Batch: 0, Samples: 64, Loss: 2.3025, BatchMS: 4.5, DataMS: 0.25, StepCount: 1, ParamNorm: ptr(31.5),
			Scalars: map[string]float64{"lr": 0.1, "grad/norm": 3.5}, RoundWaitMS: 0.25},
		{Batch: 1, Samples: 64, Loss: 2.1, BatchMS: 4.25, DataMS: 0.5, StepCount: 2},
		// The adapter carries scalars as they are: judging names is the
		// worker's job.
		{Batch: 2, Samples: 12, Loss: -0.5, StepCount: 3, ParamNorm: ptr(0), Scalars: map[string]float64{"lr": 0.05, "Not A Name": -1}},
	}
	var gotPlan Plan
	tr := serveTrainer(t, &fakeTrainer{train: func(_ context.Context, p Plan, report func(BatchReport) error) error {
		gotPlan = p
		for _, r := range reports {
			if err := report(r); err != nil {
				return err
			}
		}
		return nil
	}})
	var got []BatchReport
	if err := tr.Train(context.Background(), plan, func(r BatchReport) error {
		got = append(got, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if gotPlan != plan {
		t.Errorf("plugin got plan %+v, want %+v", gotPlan, plan)
	}
	if !reflect.DeepEqual(got, reports) {
		t.Errorf("host got reports\n%+v\nwant\n%+v", got, reports)
	}
}

func TestTrainPluginErrorEndsStream(t *testing.T) {
	tr := serveTrainer(t, &fakeTrainer{train: func(_ context.Context, _ Plan, report func(BatchReport) error) error {
		for i := range 2 {
			if err := report(BatchReport{Batch: uint64(i)}); err != nil {
				return err
			}
		}
		return errors.New("CUDA out of memory at batch 2")
	}})
	n := 0
	err := tr.Train(context.Background(), Plan{}, func(BatchReport) error { n++; return nil })
	if want := "Trainer.Train: CUDA out of memory at batch 2"; err == nil || err.Error() != want {
		t.Fatalf("Train error %v, want %q", err, want)
	}
	if n != 2 {
		t.Errorf("%d reports before the error, want 2", n)
	}
}

func TestTrainReportErrorCancelsStream(t *testing.T) {
	sawCancel := make(chan bool, 1)
	tr := serveTrainer(t, &fakeTrainer{train: func(ctx context.Context, _ Plan, report func(BatchReport) error) error {
		for i := range 5 {
			if err := report(BatchReport{Batch: uint64(i)}); err != nil {
				sawCancel <- true
				return err
			}
		}
		// All five fit in gRPC's buffers; the plugin learns of the host's
		// refusal only through its context.
		select {
		case <-ctx.Done():
			sawCancel <- true
			return ctx.Err()
		case <-time.After(10 * time.Second):
			sawCancel <- false
			return nil
		}
	}})
	stop := errors.New("coordinator asked to stop")
	var got []uint64
	err := tr.Train(context.Background(), Plan{}, func(r BatchReport) error {
		got = append(got, r.Batch)
		if len(got) == 3 {
			return stop
		}
		return nil
	})
	if err != stop {
		t.Fatalf("Train returned %v, want the report's own error %v", err, stop)
	}
	if !reflect.DeepEqual(got, []uint64{0, 1, 2}) {
		t.Errorf("reports %v delivered, want [0 1 2] and nothing after the error", got)
	}
	if !<-sawCancel {
		t.Error("the plugin's Train context was not cancelled after the report error")
	}
}

func TestTrainContextCancel(t *testing.T) {
	sawCancel := make(chan struct{})
	tr := serveTrainer(t, &fakeTrainer{train: func(ctx context.Context, _ Plan, report func(BatchReport) error) error {
		if err := report(BatchReport{Batch: 1}); err != nil {
			return err
		}
		<-ctx.Done()
		close(sawCancel)
		return ctx.Err()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := tr.Train(ctx, Plan{}, func(BatchReport) error { cancel(); return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Train error %v, want context.Canceled", err)
	}
	if !strings.HasPrefix(err.Error(), "Trainer.Train: ") {
		t.Errorf("error %q does not name the call", err)
	}
	select {
	case <-sawCancel:
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin's Train context was never cancelled")
	}
}

func TestTrainConcurrentAndLateReports(t *testing.T) {
	const workers, each = 8, 25
	var late func(BatchReport) error
	tr := serveTrainer(t, &fakeTrainer{train: func(_ context.Context, _ Plan, report func(BatchReport) error) error {
		late = report
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if err := report(BatchReport{Batch: uint64(w*each + i)}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}})
	seen := make(map[uint64]bool)
	if err := tr.Train(context.Background(), Plan{}, func(r BatchReport) error {
		seen[r.Batch] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != workers*each {
		t.Errorf("%d distinct reports arrived, want %d", len(seen), workers*each)
	}
	if err := late(BatchReport{}); err == nil {
		t.Error("a report after Train returned was accepted")
	}
}

func TestAbortWhileAverageBlocks(t *testing.T) {
	entered := make(chan struct{})
	aborted := make(chan string, 1)
	av := serveAverager(t, &fakeAverager{call: func(ctx context.Context, method string, in any) (any, error) {
		switch method {
		case "Average":
			close(entered)
			select {
			case reason := <-aborted:
				return nil, errors.New("round 7 aborted: " + reason)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case "Abort":
			aborted <- in.(string)
		}
		return nil, nil
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := av.Average(ctx, Round{Round: 7})
		done <- err
	}()
	<-entered
	if err := av.Abort(ctx, "rank 2 declared dead"); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	select {
	case err := <-done:
		if want := "Averager.Average: round 7 aborted: rank 2 declared dead"; err == nil || err.Error() != want {
			t.Fatalf("Average error %v, want %q", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Average still blocked after Abort")
	}
}

func TestAverageContextCancel(t *testing.T) {
	sawCancel := make(chan struct{})
	entered := make(chan struct{})
	av := serveAverager(t, &fakeAverager{call: func(ctx context.Context, _ string, _ any) (any, error) {
		close(entered)
		<-ctx.Done()
		close(sawCancel)
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-entered; cancel() }()
	_, err := av.Average(ctx, Round{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Average error %v, want context.Canceled", err)
	}
	select {
	case <-sawCancel:
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin's Average context was never cancelled")
	}
}

func TestInvalidLayouts(t *testing.T) {
	good := testLayout(t)
	overlap := testLayout(t)
	overlap.Entries[1].Offset = overlap.Entries[0].Offset
	short := testLayout(t)
	short.Size--
	badBytes := testLayout(t)
	badBytes.Entries[2].Bytes += 2
	unknown := testLayout(t)
	unknown.Entries[3].DType = arena.DType(42)
	noRole := testLayout(t)
	noRole.Entries[0].Role = 0

	// A plugin's Configure answer is refused on the host.
	for _, tc := range []struct {
		name   string
		layout arena.Layout
		want   string
	}{
		{"overlap", overlap, "plugin sent an invalid reply: invalid layout"},
		{"size short of the last entry", short, "plugin sent an invalid reply: invalid layout"},
		{"bytes disagree with shape", badBytes, "plugin sent an invalid reply: invalid layout"},
		{"unknown dtype", unknown, "unencodable layout"},
		{"no role", noRole, "unencodable layout"},
	} {
		t.Run("Configure reply/"+tc.name, func(t *testing.T) {
			tr := serveTrainer(t, &fakeTrainer{call: (&recorder{out: TrainerSetup{Layout: tc.layout, Samples: 1}}).call})
			setup, err := tr.Configure(context.Background(), TrainerConfig{})
			if err == nil {
				t.Fatalf("invalid layout accepted: %+v", setup.Layout)
			}
			if !strings.HasPrefix(err.Error(), "Trainer.Configure: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}

	// A host's descriptor is refused before it reaches the implementation:
	// by the host adapter when it cannot be encoded, by the plugin adapter
	// when it does not validate.
	for _, tc := range []struct {
		name string
		desc arena.Descriptor
		code codes.Code
	}{
		{"overlap", arena.Descriptor{Path: "/dev/shm/a", Layout: overlap}, codes.InvalidArgument},
		{"no path", arena.Descriptor{Layout: good}, codes.InvalidArgument},
		{"unknown dtype", arena.Descriptor{Path: "/dev/shm/a", Layout: unknown}, codes.Unknown},
		{"device block of another size", arena.Descriptor{Path: "/dev/shm/a", Layout: good,
			Device: &arena.DeviceBlock{GPU: "g", Size: good.DeviceBytes() + 4}}, codes.InvalidArgument},
		{"device block naming no GPU", arena.Descriptor{Path: "/dev/shm/a", Layout: good,
			Device: &arena.DeviceBlock{Size: good.DeviceBytes()}}, codes.InvalidArgument},
	} {
		t.Run("Attach/"+tc.name, func(t *testing.T) {
			rec := &recorder{}
			tr := serveTrainer(t, &fakeTrainer{call: rec.call})
			if _, err := tr.Attach(context.Background(), tc.desc); err == nil {
				t.Fatal("invalid descriptor accepted")
			} else if status.Code(err) != tc.code {
				t.Errorf("error %q has code %v, want %v", err, status.Code(err), tc.code)
			}
			if n, _, _ := rec.got(); n != 0 {
				t.Error("the trainer was called with an invalid descriptor")
			}
		})
		t.Run("Averager.Configure/"+tc.name, func(t *testing.T) {
			rec := &recorder{}
			av := serveAverager(t, &fakeAverager{call: rec.call})
			if _, err := av.Configure(context.Background(), AveragerConfig{Arena: tc.desc}); err == nil {
				t.Fatal("invalid descriptor accepted")
			} else if status.Code(err) != tc.code {
				t.Errorf("error %q has code %v, want %v", err, status.Code(err), tc.code)
			}
			if n, _, _ := rec.got(); n != 0 {
				t.Error("the averager was called with an invalid descriptor")
			}
		})
	}
}

// TestTrainReportsPassThrough: with no merging asked (Plan.ReportMerge),
// every report reaches the host while the plugin still trains, one by one
// and in order.
func TestTrainReportsPassThrough(t *testing.T) {
	var mu sync.Mutex
	var got []BatchReport
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	early := -1
	tr := serveTrainer(t, &fakeTrainer{train: func(_ context.Context, p Plan, report func(BatchReport) error) error {
		for i := range 3 {
			if err := report(BatchReport{Batch: uint64(i), Samples: 8, Loss: float64(i)}); err != nil {
				return err
			}
		}
		// Give reports on their way time to land before looking.
		for deadline := time.Now().Add(2 * time.Second); count() < 3 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		early = count()
		return nil
	}})
	err := tr.Train(context.Background(), Plan{}, func(r BatchReport) error {
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if early != 3 {
		t.Errorf("host had %d reports before Train ended, want 3", early)
	}
	if len(got) != 3 {
		t.Fatalf("host got %d reports, want 3", len(got))
	}
	for i, r := range got {
		if r.Batch != uint64(i) || r.Samples != 8 || r.Loss != float64(i) {
			t.Errorf("report %d is %+v, want batch %d of 8 samples, loss %d", i, r, i, i)
		}
	}
}

// TestTrainReportMerge: from ProtocolMergedReports on, the host passes
// Plan.ReportMerge and the adapter sends a plan's reports a message per
// interval (and at most maxMergedReports a message), the rest before Train
// returns, its error included; an older plugin, or a plan that asks for
// nothing, gets a message per report. TrainGrouped hands the host each
// message as one group.
func TestTrainReportMerge(t *testing.T) {
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name     string
		protocol int
		merge    time.Duration
		batches  int
		pauseAt  int // before this report the plugin waits pause (0: never)
		pause    time.Duration
		fail     error
		sees     time.Duration
		groups   []int
	}{
		{"protocol 4 merges", ProtocolMergedReports, time.Hour, 5, 0, 0, nil, time.Hour, []int{5}},
		{"protocol 3 does not", ProtocolLoadReason, time.Hour, 3, 0, 0, nil, 0, []int{1, 1, 1}},
		{"nothing asked", ProtocolMergedReports, 0, 3, 0, 0, nil, 0, []int{1, 1, 1}},
		{"an interval passes", ProtocolMergedReports, 300 * time.Millisecond, 4, 2, 400 * time.Millisecond, nil, 300 * time.Millisecond, []int{3, 1}},
		{"a full message goes at once", ProtocolMergedReports, time.Hour, maxMergedReports + 2, 0, 0, nil, time.Hour, []int{maxMergedReports, 2}},
		{"reports before the error", ProtocolMergedReports, time.Hour, 2, 0, 0, errBoom, time.Hour, []int{2}},
		{"a millisecond at least", ProtocolMergedReports, time.Microsecond, 1, 0, 0, nil, time.Millisecond, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sees time.Duration
			conn := connect(t, newGRPCServer, dialOptions(), TrainerPlugin{Impl: &fakeTrainer{train: func(_ context.Context, p Plan, report func(BatchReport) error) error {
				sees = p.ReportMerge
				for i := range tc.batches {
					if i == tc.pauseAt && tc.pause > 0 {
						time.Sleep(tc.pause)
					}
					if err := report(BatchReport{Batch: uint64(i), Samples: 8}); err != nil {
						return err
					}
				}
				return tc.fail
			}}})
			raw, err := TrainerPlugin{Protocol: tc.protocol}.GRPCClient(context.Background(), nil, conn)
			if err != nil {
				t.Fatal(err)
			}
			var groups []int
			next := uint64(0)
			err = raw.(GroupedTrainer).TrainGrouped(context.Background(), Plan{PartitionSize: 8 * uint64(tc.batches), ReportMerge: tc.merge}, func(g []BatchReport) error {
				groups = append(groups, len(g))
				for _, r := range g {
					if r.Batch != next {
						t.Errorf("report of batch %d, want %d", r.Batch, next)
					}
					next++
				}
				return nil
			})
			if tc.fail == nil && err != nil || tc.fail != nil && (err == nil || !strings.Contains(err.Error(), tc.fail.Error())) {
				t.Errorf("Train returned %v, want %v", err, tc.fail)
			}
			if sees != tc.sees {
				t.Errorf("the plugin saw ReportMerge %v, want %v", sees, tc.sees)
			}
			if !reflect.DeepEqual(groups, tc.groups) {
				t.Errorf("the host got groups of %v reports, want %v", groups, tc.groups)
			}
		})
	}
}

// The load reason is negotiated: a host of ProtocolLoadReason sends it, a
// host that negotiated an older version sends none and the plugin loads as
// for a resume; a resume's answer never claims the checkpoint's
// parameters, which a resume restores anyway; KnowsLoadReason tells the
// host which kind of plugin it has.
func TestLoadReasonNegotiated(t *testing.T) {
	for _, tc := range []struct {
		name     string
		protocol int
		reason   LoadReason
		answer   LoadResult
		sees     LoadReason
		want     LoadResult
		knows    bool
	}{
		{"protocol 3 replacement", ProtocolLoadReason, LoadReplacement, LoadResult{StepCount: 5, CheckpointParams: true}, LoadReplacement, LoadResult{StepCount: 5, CheckpointParams: true}, true},
		{"protocol 3 resume", ProtocolLoadReason, LoadResume, LoadResult{StepCount: 5, CheckpointParams: true}, LoadResume, LoadResult{StepCount: 5}, true},
		{"protocol 2 replacement", ProtocolRelay, LoadReplacement, LoadResult{StepCount: 5, CheckpointParams: true}, LoadResume, LoadResult{StepCount: 5}, false},
		{"protocol 1 resume", ProtocolBase, LoadResume, LoadResult{StepCount: 5}, LoadResume, LoadResult{StepCount: 5}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{out: tc.answer}
			conn := connect(t, newGRPCServer, dialOptions(), TrainerPlugin{Impl: &fakeTrainer{call: rec.call}})
			raw, err := TrainerPlugin{Protocol: tc.protocol}.GRPCClient(context.Background(), nil, conn)
			if err != nil {
				t.Fatal(err)
			}
			c := raw.(Trainer)
			got, err := c.LoadCheckpoint(context.Background(), "/ckpt/rank-0", tc.reason)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, in := rec.got(); in != (loadIn{"/ckpt/rank-0", tc.sees}) {
				t.Errorf("the plugin loaded %+v, want reason %v", in, tc.sees)
			}
			if got != tc.want {
				t.Errorf("the host got %+v, want %+v", got, tc.want)
			}
			if KnowsLoadReason(c) != tc.knows {
				t.Errorf("KnowsLoadReason = %v, want %v", !tc.knows, tc.knows)
			}
		})
	}
	if !KnowsLoadReason(&fakeTrainer{}) {
		t.Error("KnowsLoadReason is false for a trainer in this process")
	}
	if _, err := serveTrainer(t, &fakeTrainer{call: (&recorder{}).call}).LoadCheckpoint(context.Background(), "/d", LoadReason(7)); err == nil ||
		!strings.Contains(err.Error(), "LoadReason(7) is neither a resume nor a replacement") {
		t.Errorf("an unknown reason: %v", err)
	}
}
