package ring

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/mtls"
)

// With the run's TLS the leaders' links run inside mutual TLS: a round's
// data crosses a link both ends authenticated by certificate, and a leader
// holding another authority's certificate gets no link.
func TestLinksUnderTLS(t *testing.T) {
	dir := t.TempDir()
	if err := mtls.WriteCluster(dir, []string{"a", "b"}, mtls.Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if err := mtls.WriteCluster(other, []string{"x"}, mtls.Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	k, err := DeriveKeys(testKey)
	if err != nil {
		t.Fatal(err)
	}
	a, b, x := mtls.HostFiles(dir, "a"), mtls.HostFiles(dir, "b"), mtls.HostFiles(other, "x")
	l, err := Listen("127.0.0.1:0", k.WithTLS(&b), [16]byte{1}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", l.Port())
	hello := Hello{From: 0, To: 1, Hosts: 2, Topology: 1, Round: 3, Run: [16]byte{1}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if _, err := Dial(ctx, addr, k, hello, 2*time.Second); err == nil {
		t.Fatal("a plain link to a TLS leader was accepted")
	}
	if _, err := Dial(ctx, addr, k.WithTLS(&x), hello, 2*time.Second); err == nil || !errors.Is(err, mtls.ErrPeerCertificate) && !errors.Is(err, mtls.ErrRefusedByPeer) {
		t.Fatalf("a leader of another authority: %v, want a certificate refusal", err)
	}
	out, err := Dial(ctx, addr, k.WithTLS(&a), hello, 2*time.Second)
	if err != nil {
		t.Fatalf("a leader of the run's authority: %v", err)
	}
	defer out.Close()
	in, err := l.Accept(ctx, 0, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	payload := []byte("a shard of the round, under TLS and GMAC")
	errc := make(chan error, 1)
	go func() { errc <- out.Send(5, payload, nil) }()
	got := make([]byte, len(payload))
	if err := in.Receive(5, got, func(int, int) {}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil || string(got) != string(payload) {
		t.Fatalf("sent %q (%v), received %q", payload, err, got)
	}
}
