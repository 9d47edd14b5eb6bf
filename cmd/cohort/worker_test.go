package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugintest"
)

func TestWorkerCommandRefuses(t *testing.T) {
	t.Setenv(envSecret, "")
	t.Setenv(envSecretFile, "")
	cases := []struct {
		name string
		args []string
		code int
	}{
		{"no coordinator", []string{"--rank", "0", "--world", "1"}, 2},
		{"no rank", []string{"--coordinator", "127.0.0.1:1", "--world", "2"}, 2},
		{"rank out of range", []string{"--coordinator", "127.0.0.1:1", "--rank", "2", "--world", "2"}, 2},
		{"no world", []string{"--coordinator", "127.0.0.1:1", "--rank", "0"}, 2},
		{"stray argument", []string{"--coordinator", "127.0.0.1:1", "--rank", "0", "--world", "1", "extra"}, 2},
		{"unknown flag", []string{"--ranks", "1"}, 2},
		{"missing config", []string{"--coordinator", "127.0.0.1:1", "--rank", "0", "--world", "1", "--config", "/nonexistent/cohort.hcl"}, exitUsage},
		{"no secret", []string{"--coordinator", "127.0.0.1:1", "--rank", "0", "--world", "1"}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code := execute(append([]string{"worker"}, tc.args...)); code != tc.code {
				t.Fatalf("cohort worker %q: exit %d, want %d", tc.args, code, tc.code)
			}
		})
	}
}

// TestWorkerCommandRuns drives `cohort worker` with a config file and the
// mock plugins through a clean shutdown: exit 0.
func TestWorkerCommandRuns(t *testing.T) {
	trainerBin, _ := plugintest.BuildPlugins(t)
	secret := "worker-command-test-secret-0123456789"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "cohort.hcl")
	src := fmt.Sprintf(`
worker {
  plugin_dir = %q
}
trainer "mock" {
  samples = 64
}
averager "mock" {}
`, filepath.Dir(trainerBin))
	if err := os.WriteFile(cfg, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	codec := make(chan int, 1)
	go func() {
		codec <- execute([]string{"worker", "--coordinator", ln.Addr().String(), "--rank", "0", "--world", "1",
			"--config", cfg, "--secret-file", secretFile})
	}()

	keys, err := wire.DeriveKeys([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, _, err := wire.ServerHandshake(ctx, nc, keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Send(ctx, &wirepb.Admit{RunId: "cmd", Seed: 1}); err != nil {
		t.Fatal(err)
	}
	next := func() proto.Message {
		for {
			m, err := conn.Receive(ctx)
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			switch v := m.(type) {
			case *wirepb.Heartbeat, *wirepb.ResourceSample:
				continue
			case *wirepb.MeetRequest:
				// The mock averager meets through the relay: no endpoint.
				if v.GetKind() != "relay" {
					t.Fatalf("the mock averager asked for a %q meeting point, want relay", v.GetKind())
				}
				if err := conn.Send(ctx, &wirepb.Meeting{Kind: v.GetKind()}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			return m
		}
	}
	if r, ok := next().(*wirepb.Ready); !ok || r.GetSamples() != 64 {
		t.Fatalf("want Ready for 64 samples, got %v", r)
	}
	if err := conn.Send(ctx, &wirepb.Shutdown{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := next().(*wirepb.Exiting); !ok {
		t.Fatal("want Exiting")
	}
	select {
	case code := <-codec:
		if code != 0 {
			t.Fatalf("exit code %d, want 0", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cohort worker did not exit")
	}
}
