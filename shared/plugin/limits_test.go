package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Big control messages, built once: both are well past gRPC's 4 MiB default
// and well under MaxMessageBytes.
var (
	bigOnce     sync.Once
	bigSettings json.RawMessage
	bigLayout   arena.Layout
	bigErr      error
)

func bigMessages(t *testing.T) (json.RawMessage, arena.Layout) {
	t.Helper()
	bigOnce.Do(func() {
		var b bytes.Buffer
		b.WriteString(`{"vocab":[`)
		for i := 0; b.Len() < 6<<20; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"token-%08d"`, i)
		}
		b.WriteString(`]}`)
		bigSettings = b.Bytes()

		entries := make([]arena.Entry, 50000)
		for i := range entries {
			entries[i] = arena.Entry{
				Name:  fmt.Sprintf("model.encoder.layers.%05d.attention.self.query.weight.shard-of-a-tensor-with-a-long-name", i),
				DType: arena.F32, Shape: []int64{16, 4}, Role: arena.Parameter,
			}
		}
		bigLayout, bigErr = arena.Pack(entries)
	})
	if bigErr != nil {
		t.Fatal(bigErr)
	}
	return bigSettings, bigLayout
}

func TestMessagesOverFourMiB(t *testing.T) {
	settings, layout := bigMessages(t)
	defaultServer := func(opts []grpc.ServerOption) *grpc.Server { return grpc.NewServer(opts...) }
	cases := []struct {
		name      string
		newServer func([]grpc.ServerOption) *grpc.Server
		dial      []grpc.DialOption
		settings  json.RawMessage
		layout    arena.Layout
		wantCode  codes.Code
	}{
		{"big request", newGRPCServer, dialOptions(), settings, arena.Layout{}, codes.OK},
		{"big reply", newGRPCServer, dialOptions(), nil, layout, codes.OK},
		// The controls show the two above would fail without the limits.
		{"big request, default server", defaultServer, dialOptions(), settings, arena.Layout{}, codes.ResourceExhausted},
		{"big reply, default client", newGRPCServer, nil, nil, layout, codes.ResourceExhausted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{out: TrainerSetup{Layout: tc.layout}}
			conn := connect(t, tc.newServer, tc.dial, TrainerPlugin{Impl: &fakeTrainer{call: rec.call}})
			raw, _ := TrainerPlugin{}.GRPCClient(context.Background(), nil, conn)
			setup, err := raw.(Trainer).Configure(context.Background(), TrainerConfig{Settings: tc.settings})
			if code := status.Code(err); code != tc.wantCode {
				t.Fatalf("Configure: code %v (%v), want %v", code, err, tc.wantCode)
			}
			if tc.wantCode != codes.OK {
				return
			}
			if _, _, in := rec.got(); !bytes.Equal(in.(TrainerConfig).Settings, tc.settings) {
				t.Error("settings changed on the way to the plugin")
			}
			if !reflect.DeepEqual(setup.Layout, tc.layout) {
				t.Error("layout changed on the way to the host")
			}
		})
	}
}

// The host's limit is MaxMessageBytes, not unlimited: go-plugin's own dial
// options allow any size, so this shows ours come after and decide. The
// plugin's server here takes anything, so only the host can refuse.
func TestMessageOverLimitRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 64 MiB")
	}
	unlimited := func(opts []grpc.ServerOption) *grpc.Server {
		return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(math.MaxInt32))...)
	}
	client, rec := inProcessTrainer(t, unlimited)
	tr, err := DispenseTrainer(client)
	if err != nil {
		t.Fatal(err)
	}
	huge := make(json.RawMessage, MaxMessageBytes+1)
	_, err = tr.Configure(context.Background(), TrainerConfig{Settings: huge})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "send message larger than max") {
		t.Fatalf("Configure with %d bytes of settings: %v, want the host to refuse sending it", len(huge), err)
	}
	if n, _, _ := rec.got(); n != 0 {
		t.Error("the oversized request reached the plugin")
	}
}
