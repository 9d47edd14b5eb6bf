package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serveInProcess runs go-plugin's real server with serveConfig in test mode
// (no cookie, no handshake line, no stdio takeover) and returns a host
// client built from ClientConfig that reattaches to it. newServer, when
// set, replaces the plugin's gRPC server factory.
func serveInProcess(t *testing.T, kind string, p goplugin.Plugin, newServer func([]grpc.ServerOption) *grpc.Server) *goplugin.Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reattach := make(chan *goplugin.ReattachConfig, 1)
	closed := make(chan struct{})
	// go-plugin's client offers its versions in the plugin's environment;
	// in test mode there is no client process start, so offer them here.
	var offered []string
	for _, v := range Protocols() {
		offered = append(offered, strconv.Itoa(v))
	}
	t.Setenv("PLUGIN_PROTOCOL_VERSIONS", strings.Join(offered, ","))
	cfg := serveConfig(kind, p, Protocols(), hclog.NewNullLogger())
	if newServer != nil {
		cfg.GRPCServer = newServer
	}
	cfg.Test = &goplugin.ServeTestConfig{Context: ctx, ReattachConfigCh: reattach, CloseCh: closed}
	go goplugin.Serve(cfg)

	var rc *goplugin.ReattachConfig
	select {
	case rc = <-reattach:
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("plugin server did not start")
	}
	ccfg := ClientConfig(ClientOptions{Logger: hclog.NewNullLogger()})
	ccfg.Reattach = rc
	// go-plugin negotiates the plugin set only when it starts the process.
	ccfg.Plugins = ccfg.VersionedPlugins[ProtocolVersion]
	client := goplugin.NewClient(ccfg)
	t.Cleanup(func() {
		client.Kill()
		cancel()
		<-closed
	})
	return client
}

func inProcessTrainer(t *testing.T, newServer func([]grpc.ServerOption) *grpc.Server) (*goplugin.Client, *recorder) {
	rec := &recorder{out: Description{Name: "fake-trainer"}}
	return serveInProcess(t, KindTrainer, TrainerPlugin{Impl: &fakeTrainer{call: rec.call}}, newServer), rec
}

func TestServeConfigWithGoPlugin(t *testing.T) {
	client, rec := inProcessTrainer(t, nil)
	rpc, err := client.Client()
	if err != nil {
		t.Fatal(err)
	}
	if v := client.NegotiatedVersion(); v != ProtocolVersion {
		t.Errorf("negotiated version %d, want %d", v, ProtocolVersion)
	}
	// Ping is go-plugin's health check of the "plugin" service: it proves
	// the health service is registered on the server newGRPCServer built.
	if err := rpc.Ping(); err != nil {
		t.Fatalf("health check: %v", err)
	}

	tr, err := DispenseTrainer(client)
	if err != nil {
		t.Fatal(err)
	}
	d, err := tr.Describe(context.Background())
	if err != nil || d.Name != "fake-trainer" {
		t.Fatalf("Describe = %+v, %v", d, err)
	}
	settings, _ := bigMessages(t)
	rec.answer(TrainerSetup{})
	if _, err := tr.Configure(context.Background(), TrainerConfig{Settings: settings}); err != nil {
		t.Fatalf("Configure with %d bytes of settings: %v", len(settings), err)
	}

	// The same binary asked for the other kind: dispensing cannot tell,
	// the first call does, and says so.
	av, err := DispenseAverager(client)
	if err != nil {
		t.Fatal(err)
	}
	_, err = av.Describe(context.Background())
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "not served by this plugin") {
		t.Errorf("averager call to a trainer plugin: %v", err)
	}
}

func TestDispenseErrors(t *testing.T) {
	missing := ClientConfig(ClientOptions{
		Cmd:          exec.Command("/nonexistent/cohort-trainer-none"),
		Logger:       hclog.NewNullLogger(),
		StartTimeout: 5 * time.Second,
	})
	cases := []struct {
		name   string
		client *goplugin.Client
		want   string
	}{
		{"nil client", nil, "dispense trainer plugin: no client"},
		{"binary missing", goplugin.NewClient(missing), "start trainer plugin: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.client != nil {
				defer tc.client.Kill()
			}
			tr, err := DispenseTrainer(tc.client)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("DispenseTrainer = %v, %v; want an error starting %q", tr, err, tc.want)
			}
		})
	}
}

func TestClientConfig(t *testing.T) {
	cmd := exec.Command("/opt/cohort/plugins/cohort-averaging-cpu")
	sc := &goplugin.SecureConfig{Checksum: []byte{1, 2, 3}}
	cfg := ClientConfig(ClientOptions{Cmd: cmd, SecureConfig: sc, StartTimeout: 7 * time.Second})
	if cfg.HandshakeConfig != Handshake() || cfg.ProtocolVersion != 0 {
		t.Errorf("handshake %+v, want %+v without a fixed protocol version", cfg.HandshakeConfig, Handshake())
	}
	if h := Handshake(); h.MagicCookieKey == "" || h.MagicCookieValue == "" {
		t.Error("empty magic cookie")
	}
	if !cfg.AutoMTLS {
		t.Error("AutoMTLS off: any local process could call the plugin over its socket")
	}
	if !reflect.DeepEqual(cfg.AllowedProtocols, []goplugin.Protocol{goplugin.ProtocolGRPC}) {
		t.Errorf("allowed protocols %v, want gRPC only", cfg.AllowedProtocols)
	}
	if len(cfg.VersionedPlugins) != len(Protocols()) {
		t.Errorf("versions %v, want %v", cfg.VersionedPlugins, Protocols())
	}
	for _, v := range Protocols() {
		set := cfg.VersionedPlugins[v]
		if _, ok := set[KindTrainer].(TrainerPlugin); !ok || len(set) != 2 {
			t.Errorf("protocol %d: plugin set %v, want trainer and averager", v, set)
		}
		if a, ok := set[KindAverager].(AveragerPlugin); !ok || a.Protocol != v {
			t.Errorf("protocol %d: plugin set %v, want trainer and averager of that protocol", v, set)
		}
	}
	if cfg.Cmd != cmd || cfg.SecureConfig != sc || cfg.StartTimeout != 7*time.Second {
		t.Error("Cmd, SecureConfig or StartTimeout not passed through")
	}
	if cfg.Logger == nil || len(cfg.GRPCDialOptions) == 0 || cfg.SyncStdout == nil || cfg.SyncStderr == nil {
		t.Error("logger, dial options or stdio sinks missing")
	}
}

func TestBuild(t *testing.T) {
	logger := hclog.NewNullLogger()
	broken := errors.New("libtorch: cannot open libcudart.so")
	var gotLogger hclog.Logger
	trainer := func(l hclog.Logger) (Trainer, error) { gotLogger = l; return &fakeTrainer{}, nil }
	averager := func(hclog.Logger) (Averager, error) { return &fakeAverager{}, nil }
	cases := []struct {
		name     string
		opts     ServeOptions
		wantKind string
		wantErr  string
	}{
		{"trainer", ServeOptions{Trainer: trainer}, KindTrainer, ""},
		{"averager", ServeOptions{Averager: averager}, KindAverager, ""},
		{"both", ServeOptions{Trainer: trainer, Averager: averager}, "", "sets both"},
		{"neither", ServeOptions{Name: "x"}, "", "sets neither"},
		{"factory error", ServeOptions{Trainer: func(hclog.Logger) (Trainer, error) { return nil, broken }}, "", "build trainer: libtorch: cannot open libcudart.so"},
		{"nil trainer", ServeOptions{Trainer: func(hclog.Logger) (Trainer, error) { return nil, nil }}, "", "returned no trainer"},
		{"nil averager", ServeOptions{Averager: func(hclog.Logger) (Averager, error) { return nil, nil }}, "", "returned no averager"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kind, p, err := build(tc.opts, logger)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("build error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if kind != tc.wantKind {
				t.Errorf("kind %q, want %q", kind, tc.wantKind)
			}
			cfg := serveConfig(kind, p, Protocols(), logger)
			if set := cfg.VersionedPlugins[ProtocolVersion]; len(cfg.VersionedPlugins) != len(Protocols()) || len(set) != 1 || set[kind] == nil {
				t.Errorf("served plugins %v, want {%d: {%s}} among %v", cfg.VersionedPlugins, ProtocolVersion, kind, Protocols())
			}
			if cfg.HandshakeConfig != Handshake() || cfg.GRPCServer == nil || cfg.Logger != logger {
				t.Error("serve config lacks the handshake, the gRPC server or the logger")
			}
		})
	}
	if _, _, err := build(ServeOptions{Trainer: func(hclog.Logger) (Trainer, error) { return nil, broken }}, logger); !errors.Is(err, broken) {
		t.Errorf("factory error not wrapped: %v", err)
	}
	if gotLogger != logger {
		t.Error("the factory did not get the plugin's logger")
	}
}

func TestLogger(t *testing.T) {
	cases := []struct {
		env  string
		want hclog.Level
	}{
		{"", hclog.Info},
		{"debug", hclog.Debug},
		{" TRACE ", hclog.Trace},
		{"error", hclog.Error},
		{"loud", hclog.Info},
	}
	for _, tc := range cases {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(LogLevelEnv, tc.env)
			var b bytes.Buffer
			l := newLogger("cohort-trainer-mock", &b)
			if l.GetLevel() != tc.want {
				t.Errorf("level %v, want %v", l.GetLevel(), tc.want)
			}
			b.Reset()
			l.Error("loaded", "model", "mlp")
			var line map[string]any
			if err := json.Unmarshal(b.Bytes(), &line); err != nil {
				t.Fatalf("log line %q is not JSON, so the host cannot forward it: %v", b.String(), err)
			}
			if line["@module"] != "cohort-trainer-mock" || line["@level"] != "error" || line["@message"] != "loaded" || line["model"] != "mlp" {
				t.Errorf("log line %v", line)
			}
		})
	}
}

// watchParent notices the recorded parent change: by polling, and by
// polling still when the wait for the parent's exit fails.
func TestWatchParent(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait func() error
	}{
		{"polling", nil},
		{"wait failed", func() error { return errors.New("no poller") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The recorded parent is compared, not pid 1: a host may itself
			// be pid 1 in a container, and a subreaper adopts orphans.
			var calls atomic.Int32
			getppid := func() int {
				if calls.Add(1) < 4 {
					return 1
				}
				return 4242
			}
			gone := make(chan struct{})
			go watchParent(1, getppid, tc.wait, time.Millisecond, func() { close(gone) })
			select {
			case <-gone:
			case <-time.After(10 * time.Second):
				t.Fatal("parent change not noticed")
			}
			if n := calls.Load(); n != 4 {
				t.Errorf("noticed after %d getppid calls, want 4", n)
			}
		})
	}
}

func TestProtectStdout(t *testing.T) {
	outR, outW, err := os.Pipe() // stands in for the handshake pipe
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe() // stands in for stderr
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	defer errR.Close()
	stdoutFD, stderrFD := int(outW.Fd()), int(errW.Fd())

	handshake, err := protectStdout(stdoutFD, stderrFD)
	if err != nil {
		t.Fatal(err)
	}
	if fd := int(handshake.Fd()); fd == stdoutFD || fd == stderrFD {
		t.Fatalf("private descriptor %d reuses a standard one", fd)
	}
	if flags, err := unix.FcntlInt(handshake.Fd(), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("private descriptor flags %#x, %v: children would inherit the handshake pipe", flags, err)
	}

	// What C code writes to "fd 1" before the handshake...
	if _, err := unix.Write(stdoutFD, []byte("libtorch: using 8 threads\n")); err != nil {
		t.Fatal(err)
	}
	// ...and the handshake line.
	if _, err := handshake.WriteString("1|1|unix|/tmp/plugin1|grpc|\n"); err != nil {
		t.Fatal(err)
	}
	handshake.Close()
	outW.Close() // now a copy of errW
	errW.Close()

	out, _ := io.ReadAll(outR)
	errOut, _ := io.ReadAll(errR)
	if string(out) != "1|1|unix|/tmp/plugin1|grpc|\n" {
		t.Errorf("handshake stream got %q, want the handshake line alone", out)
	}
	if string(errOut) != "libtorch: using 8 threads\n" {
		t.Errorf("stderr got %q, want the noise", errOut)
	}
}

func TestCheckProtocols(t *testing.T) {
	cases := []struct {
		in      []int
		want    []int
		wantErr string
	}{
		{nil, Protocols(), ""},
		{[]int{ProtocolBase}, []int{ProtocolBase}, ""},
		{[]int{ProtocolVersion, ProtocolBase}, []int{ProtocolBase, ProtocolVersion}, ""},
		{[]int{ProtocolVersion + 1}, nil, "not 5"},
		{[]int{0}, nil, "not 0"},
		{[]int{1, 1}, nil, "twice"},
	}
	for _, tc := range cases {
		got, err := checkProtocols(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("checkProtocols(%v) error %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("checkProtocols(%v) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestExplainStart(t *testing.T) {
	other := errors.New("fork/exec: permission denied")
	if got := ExplainStart("cohort-averaging-x", other); got != other {
		t.Errorf("ExplainStart(other) = %v, want it unchanged", got)
	}
	raw := errors.New("incompatible API version with plugin. Plugin version: 5, Client versions: [1 2 3 4]")
	err := ExplainStart("cohort-averaging-x", raw)
	want := "plugin cohort-averaging-x speaks cohort plugin protocol 5; this cohort speaks " + ProtocolRange()
	if err == nil || err.Error() != want {
		t.Errorf("ExplainStart = %v, want %q", err, want)
	}
	if !errors.Is(err, ErrProtocol) || !errors.Is(err, raw) {
		t.Errorf("%v does not wrap ErrProtocol and go-plugin's error", err)
	}
	if ProtocolRange() != "1-4" || !reflect.DeepEqual(Protocols(), []int{1, 2, 3, 4}) {
		t.Errorf("Protocols %v (%s), want [1 2 3 4] (1-4)", Protocols(), ProtocolRange())
	}
}
