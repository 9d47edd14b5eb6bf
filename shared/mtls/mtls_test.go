package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cluster writes a cluster's files for hosts (plus loopback names) and
// returns the directory.
func cluster(t *testing.T, hosts ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteCluster(dir, hosts, Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	return dir
}

// pair runs a handshake between a server and a client over loopback TCP
// and returns both sides' errors; the client then reads one byte, which is
// where a TLS 1.3 client learns that the server refused its certificate.
func pair(t *testing.T, srv, cli *tls.Config) (srvErr, cliErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		tc, err := Server(ctx, nc, srv, 5*time.Second, "the rank")
		if err == nil {
			_, err = tc.Write([]byte{1})
			tc.Close()
		}
		done <- err
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc, cliErr := Client(ctx, nc, cli, 5*time.Second, "the coordinator")
	if cliErr == nil {
		var b [1]byte
		_, cliErr = tc.Read(b[:])
		cliErr = Explain(cliErr, "the coordinator")
		tc.Close()
	}
	return <-done, cliErr
}

func TestHandshake(t *testing.T) {
	dir, other := cluster(t, "node-a", "node-b"), cluster(t, "node-a")
	stranger := t.TempDir() // a certificate for another name, no loopback
	if err := WriteCluster(stranger, []string{"elsewhere"}, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	serverCfg := func(f Files) *tls.Config {
		c, err := f.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	clientCfg := func(f Files, name string) *tls.Config {
		c, err := f.ClientConfig(name)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	noCert := clientCfg(HostFiles(dir, "node-b"), "127.0.0.1")
	noCert.Certificates = nil
	// Another CA's files, but trusting ours: only its certificate is foreign.
	foreignClient := clientCfg(HostFiles(other, "node-a"), "127.0.0.1")
	foreignClient.RootCAs = clientCfg(HostFiles(dir, "node-b"), "").RootCAs
	foreignServer := serverCfg(HostFiles(other, "node-a"))
	foreignServer.ClientCAs = serverCfg(HostFiles(dir, "node-a")).ClientCAs
	strangerServer := serverCfg(HostFiles(stranger, "elsewhere"))

	for _, tc := range []struct {
		name             string
		srv, cli         *tls.Config
		srvWant, cliWant error
		srvSays, cliSays string
	}{
		{name: "same CA", srv: serverCfg(HostFiles(dir, "node-a")), cli: clientCfg(HostFiles(dir, "node-b"), "127.0.0.1")},
		{name: "by host name", srv: serverCfg(HostFiles(dir, "node-a")), cli: clientCfg(HostFiles(dir, "node-b"), "localhost")},
		{name: "no client certificate", srv: serverCfg(HostFiles(dir, "node-a")), cli: noCert,
			srvSays: "didn't provide a certificate", cliWant: ErrRefusedByPeer, cliSays: "the coordinator refused"},
		{name: "client certificate from another CA", srv: serverCfg(HostFiles(dir, "node-a")), cli: foreignClient,
			srvWant: ErrPeerCertificate, srvSays: "the rank's TLS certificate did not verify", cliWant: ErrRefusedByPeer},
		{name: "server certificate from another CA", srv: foreignServer, cli: clientCfg(HostFiles(dir, "node-b"), "127.0.0.1"),
			srvWant: ErrRefusedByPeer, srvSays: "the rank refused", cliWant: ErrPeerCertificate, cliSays: "the coordinator's TLS certificate did not verify"},
		{name: "wrong server name", srv: strangerServer, cli: clientCfg(HostFiles(stranger, "elsewhere"), "127.0.0.1"), srvWant: ErrRefusedByPeer, cliWant: ErrPeerCertificate, cliSays: "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvErr, cliErr := pair(t, tc.srv, tc.cli)
			check := func(side string, err, want error, says string) {
				ok := tc.srvSays == "" && tc.cliSays == "" && tc.srvWant == nil && tc.cliWant == nil
				switch {
				case ok && err != nil:
					t.Errorf("%s: %v", side, err)
				case !ok && err == nil:
					t.Errorf("%s: no error, want a refusal", side)
				case want != nil && !errors.Is(err, want):
					t.Errorf("%s: %v, want one wrapping %q", side, err, want)
				case says != "" && !strings.Contains(err.Error(), says):
					t.Errorf("%s: %v, want it to say %q", side, err, says)
				}
			}
			check("server", srvErr, tc.srvWant, tc.srvSays)
			check("client", cliErr, tc.cliWant, tc.cliSays)
		})
	}
}

func TestCheckNamesTheFileAtFault(t *testing.T) {
	dir, other := cluster(t, "a", "b"), cluster(t, "a")
	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := HostFiles(dir, "a")
	for _, tc := range []struct {
		name  string
		f     Files
		field string
		says  string
	}{
		{"missing CA", Files{CA: filepath.Join(dir, "nope.pem"), Cert: good.Cert, Key: good.Key}, "ca", "no such file"},
		{"CA not PEM", Files{CA: junk, Cert: good.Cert, Key: good.Key}, "ca", "no PEM CERTIFICATE"},
		{"no key named", Files{CA: good.CA, Cert: good.Cert}, "key", "needs ca, cert and key"},
		{"key of another host", Files{CA: good.CA, Cert: good.Cert, Key: HostFiles(dir, "b").Key}, "cert", "private key does not match"},
		{"certificate of another CA", Files{CA: good.CA, Cert: HostFiles(other, "a").Cert, Key: HostFiles(other, "a").Key}, "cert", "does not chain to the CA"},
		{"cert not PEM", Files{CA: good.CA, Cert: junk, Key: good.Key}, "cert", "with key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.Check()
			var fe *FileError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Check: %v, want a FileError on %s saying %q", err, tc.field, tc.says)
			}
		})
	}
	if err := good.Check(); err != nil {
		t.Errorf("good files: %v", err)
	}
}

func TestWriteCluster(t *testing.T) {
	dir := t.TempDir()
	hosts := []string{"node-1", "10.0.0.7"}
	if err := WriteCluster(dir, hosts, Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		f := HostFiles(dir, h)
		if err := f.Check(); err != nil {
			t.Errorf("%s: %v", h, err)
		}
		st, err := os.Stat(f.Key)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: key mode %v, want 0600", h, st.Mode().Perm())
		}
		b, _ := os.ReadFile(f.Cert)
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range append([]string{h}, Loopback...) {
			if err := c.VerifyHostname(name); err != nil {
				t.Errorf("%s's certificate: %v", h, err)
			}
		}
		if err := c.VerifyHostname("node-9"); err == nil {
			t.Errorf("%s's certificate is valid for node-9", h)
		}
		if !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
			t.Errorf("%s's certificate has usages %v, want server and client", h, c.ExtKeyUsage)
		}
	}
	if err := WriteCluster(dir, []string{"node-2"}, nil, time.Hour); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second init into the same directory: %v, want it refused", err)
	}
	for _, bad := range [][]string{nil, {"a b"}, {"../x"}, {"a", "a"}} {
		if err := WriteCluster(t.TempDir(), bad, nil, time.Hour); err == nil {
			t.Errorf("hosts %q: no error", bad)
		}
	}
}

// A CA file is read from disk as any other input: nothing in it may panic.
func FuzzCheckCA(f *testing.F) {
	dir := f.TempDir()
	if err := WriteCluster(dir, []string{"a"}, nil, time.Hour); err != nil {
		f.Fatal(err)
	}
	good := HostFiles(dir, "a")
	ca, _ := os.ReadFile(good.CA)
	f.Add(ca)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_ = Files{CA: p, Cert: good.Cert, Key: good.Key}.Check()
	})
}
