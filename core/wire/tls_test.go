package wire

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/mtls"
)

// tlsFiles writes a cluster's certificates (as `cohort tls init` does)
// for hosts, valid on loopback too, and returns each host's files.
func tlsFiles(t *testing.T, hosts ...string) map[string]mtls.Files {
	t.Helper()
	dir := t.TempDir()
	if err := mtls.WriteCluster(dir, hosts, mtls.Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	out := map[string]mtls.Files{}
	for _, h := range hosts {
		out[h] = mtls.HostFiles(dir, h)
	}
	return out
}

// tlsHandshake runs both handshakes over loopback TCP, the coordinator
// with srv and the rank with cli, and returns both ends' results.
func tlsHandshake(t *testing.T, srv, cli *tls.Config, secret []byte) (rank, coord *Conn, rankErr, coordErr error) {
	t.Helper()
	cn, sn := rawPair(t, "tcp")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, _, err := ServerHandshake(ctx, sn, mustKeys(t, testSecret), nil, WithTLS(srv))
		ch <- res{c, err}
	}()
	rank, rankErr = ClientHandshake(ctx, cn, mustKeys(t, secret), Hello{Rank: 1, World: 2}, WithTLS(cli))
	r := <-ch
	return rank, r.c, rankErr, r.err
}

// The control handshake inside mutual TLS: frames flow both ways, and the
// secret still authenticates the run beneath it.
func TestTLSHandshake(t *testing.T) {
	files := tlsFiles(t, "coord", "node")
	srv, err := files["coord"].ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := files["node"].ClientConfigFor("127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	rank, coord, rankErr, coordErr := tlsHandshake(t, srv, cli, testSecret)
	if rankErr != nil || coordErr != nil {
		t.Fatalf("handshake: rank %v, coordinator %v", rankErr, coordErr)
	}
	defer rank.Close()
	defer coord.Close()
	if _, ok := rank.nc.(*tls.Conn); !ok {
		t.Fatalf("rank's connection is a %T, not TLS", rank.nc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rank.Send(ctx, &wirepb.Heartbeat{}); err != nil {
		t.Fatal(err)
	}
	if m, err := coord.Receive(ctx); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*wirepb.Heartbeat); !ok {
		t.Fatalf("coordinator received %T", m)
	}
	if err := coord.Send(ctx, &wirepb.CoordinatorHeartbeat{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rank.Receive(ctx); err != nil {
		t.Fatal(err)
	}

	// The right certificate with the wrong secret is still refused.
	_, _, rankErr, coordErr = tlsHandshake(t, srv, cli, otherSecret)
	if !errors.Is(coordErr, authframe.ErrBadTag) || rankErr == nil {
		t.Errorf("another secret under TLS: rank %v, coordinator %v; want the hello's tag refused", rankErr, coordErr)
	}
}

// Each refusal is said on both ends: which side refused whose certificate.
func TestTLSRefusals(t *testing.T) {
	ours, theirs := tlsFiles(t, "coord", "node"), tlsFiles(t, "coord", "node")
	named := t.TempDir() // a coordinator certificate for a name the rank does not dial
	if err := mtls.WriteCluster(named, []string{"coord-elsewhere", "node"}, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	server := func(f mtls.Files) *tls.Config {
		c, err := f.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	client := func(f mtls.Files) *tls.Config {
		c, err := f.ClientConfigFor("127.0.0.1:7000")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	noCert := client(ours["node"])
	noCert.Certificates = nil
	foreignRank := client(theirs["node"])
	foreignRank.RootCAs = client(ours["node"]).RootCAs // trusts our coordinator
	foreignCoord := server(theirs["coord"])
	foreignCoord.ClientCAs = server(ours["coord"]).ClientCAs // trusts our ranks

	for _, tc := range []struct {
		name              string
		srv, cli          *tls.Config
		coordSays, rankIs string
		rankWant          error
	}{
		{"no rank certificate", server(ours["coord"]), noCert,
			"didn't provide a certificate", "the coordinator refused this side's TLS certificate", mtls.ErrRefusedByPeer},
		{"rank certificate from another CA", server(ours["coord"]), foreignRank,
			"the rank's TLS certificate did not verify", "the coordinator refused this side's TLS certificate", mtls.ErrRefusedByPeer},
		{"coordinator certificate from another CA", foreignCoord, client(ours["node"]),
			"the rank refused", "the coordinator's TLS certificate did not verify", mtls.ErrPeerCertificate},
		{"coordinator certificate for another name", server(mtls.HostFiles(named, "coord-elsewhere")), client(mtls.HostFiles(named, "node")),
			"the rank refused", "for 127.0.0.1", mtls.ErrPeerCertificate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, rankErr, coordErr := tlsHandshake(t, tc.srv, tc.cli, testSecret)
			if coordErr == nil || !strings.Contains(coordErr.Error(), tc.coordSays) || !strings.Contains(coordErr.Error(), "127.0.0.1") {
				t.Errorf("coordinator: %v, want it to name the remote and say %q", coordErr, tc.coordSays)
			}
			if !errors.Is(rankErr, tc.rankWant) || !strings.Contains(rankErr.Error(), tc.rankIs) {
				t.Errorf("rank: %v, want %q saying %q", rankErr, tc.rankWant, tc.rankIs)
			}
		})
	}

	// A rank without TLS at all against a TLS coordinator: both ends say so.
	cn, sn := rawPair(t, "tcp")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := make(chan error, 1)
	go func() {
		_, _, err := ServerHandshake(ctx, sn, mustKeys(t, testSecret), nil, WithTLS(server(ours["coord"])))
		ch <- err
	}()
	_, rankErr := ClientHandshake(ctx, cn, mustKeys(t, testSecret), Hello{Rank: 0, World: 1})
	if coordErr := <-ch; coordErr == nil || !strings.Contains(coordErr.Error(), "TLS handshake") {
		t.Errorf("plain rank, coordinator: %v", coordErr)
	}
	if rankErr == nil || !strings.Contains(rankErr.Error(), "require TLS") {
		t.Errorf("plain rank: %v, want a hint that the coordinator may require TLS", rankErr)
	}
}
