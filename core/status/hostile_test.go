package status

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/internal/testutil/hostile"
)

// The status server drops what no browser or scraper sends (garbage, 4 GiB
// lengths, a trickled request, silence, headers past the limit), a hundred
// at a time, keeps nothing of them, refuses what it does not serve, serves
// nothing outside its page, API and metrics, and still answers an honest
// request afterwards. It listens on loopback unless told otherwise.
func TestHostileRequests(t *testing.T) {
	if host, _, err := net.SplitHostPort(config.Default().Coordinator.HTTP); err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("the default status address %q is not loopback", config.Default().Coordinator.HTTP)
	}
	readHeaderTimeout = time.Second
	defer func() { readHeaderTimeout = 5 * time.Second }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	snap := testSnapshot(time.Now())
	go func() { served <- Serve(ctx, ln, func() *Snapshot { return snap }) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()

	rawRequest(t, addr, "GET", "/api/v1/status") // the server runs before anything is counted
	heap0, g0 := hostile.Settle(0, 0)
	cases := append(hostile.Cases([]byte("GET /api/v1/status HTTP/1.1\r\nHost: x\r\nX-Trickled: ")),
		hostile.Case{Name: "headers past the limit", Send: []byte("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2*maxHeaderBytes) + "\r\n\r\n")})
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if err := hostile.Burst(context.Background(), addr, c, 100, 5*time.Second); err != nil {
				t.Fatal(err)
			}
		})
	}
	heap1, g1 := hostile.Settle(g0, 5*time.Second)
	t.Logf("heap %d -> %d KiB, goroutines %d -> %d", heap0>>10, heap1>>10, g0, g1)
	if g1 > g0 {
		t.Errorf("%d goroutines left after the hostile connections, %d before", g1, g0)
	}
	if heap1 > heap0+4<<20 {
		t.Errorf("heap grew from %d to %d KiB", heap0>>10, heap1>>10)
	}

	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/api/v1/status", http.StatusOK},
		{"GET", "/metrics", http.StatusOK},
		{"POST", "/api/v1/status", http.StatusMethodNotAllowed},
		{"DELETE", "/metrics", http.StatusMethodNotAllowed},
		{"GET", "/../../../../etc/passwd", http.StatusNotFound},
		{"GET", "/%2e%2e/%2e%2e/etc/passwd", http.StatusNotFound},
		{"GET", "/nosuch", http.StatusNotFound},
	} {
		code, body := rawRequest(t, addr, c.method, c.path)
		// A path outside the page is refused, or redirected to its clean
		// form inside it, which does not exist.
		refused := c.want == http.StatusNotFound && (code == http.StatusBadRequest || code == http.StatusMovedPermanently || code == http.StatusTemporaryRedirect)
		if code != c.want && !refused {
			t.Errorf("%s %s: status %d, want %d", c.method, c.path, code, c.want)
		}
		if strings.Contains(body, "root:") {
			t.Errorf("%s %s served a file from outside the page", c.method, c.path)
		}
	}
}

// rawRequest sends one request as written (no client-side path cleaning)
// and returns the status and body.
func rawRequest(t *testing.T, addr, method, path string) (int, string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(nc, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", method, path)
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	io.Copy(&body, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body.String()
}
