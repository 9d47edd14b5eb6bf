package plugintest

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A plugin's unix socket answers only its host: plugin.ClientConfig turns
// on go-plugin's AutoMTLS, so another process that reaches the socket, in
// plaintext or over TLS without the host's certificate, gets no call
// through, while the host's own calls work.
func TestPluginSocketRefusesStrangers(t *testing.T) {
	trainerBin, _ := BuildPlugins(t)
	tr, client := StartTrainer(t, trainerBin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := tr.Describe(ctx); err != nil {
		t.Fatalf("the host's own call: %v", err)
	}
	addr := client.ReattachConfig().Addr
	if addr.Network() != "unix" {
		t.Fatalf("plugin listens on %s %s, want a unix socket", addr.Network(), addr)
	}
	noCert := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} // a stranger cannot verify either
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext", insecure.NewCredentials()},
		{"TLS without a client certificate", credentials.NewTLS(noCert)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient("unix:"+addr.String(), grpc.WithTransportCredentials(tc.creds),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "unix", addr.String())
				}))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			defer ccancel()
			// The health service is the one every go-plugin server has.
			resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{Service: "plugin"})
			if err == nil {
				t.Fatalf("a stranger's call went through: %v", resp)
			}
			t.Logf("refused: %v", err)
		})
	}
	if _, err := tr.Describe(ctx); err != nil {
		t.Fatalf("the host's call after the strangers': %v", err)
	}
}
