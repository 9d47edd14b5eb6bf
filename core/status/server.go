package status

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

//go:embed web
var web embed.FS

// Source returns the latest published Snapshot; nil before the first.
type Source func() *Snapshot

// Handler serves the status page at /, the JSON API at /api/v1/status and
// Prometheus metrics at /metrics, all from src.
func Handler(src Source) http.Handler {
	mux := http.NewServeMux()
	static, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/v1/status", func(w http.ResponseWriter, r *http.Request) {
		snap := src()
		if snap == nil {
			http.Error(w, "the run has not started", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if err := json.NewEncoder(w).Encode(snap.at(time.Now())); err != nil {
			return // the client went away
		}
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(src))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// readHeaderTimeout bounds a request's headers: a client that trickles
// them (slowloris) is dropped after it.
var readHeaderTimeout = 5 * time.Second

// maxHeaderBytes bounds a request's headers; larger ones are refused (431)
// before anything is kept of them.
const maxHeaderBytes = 64 << 10

// Serve serves Handler(src) on ln until ctx ends, then shuts down, giving
// requests in flight a second; it closes ln.
func Serve(ctx context.Context, ln net.Listener, src Source) error {
	srv := &http.Server{
		Handler:           Handler(src),
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("status server on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("status server on %s: shut down: %w", ln.Addr(), err)
	}
	return nil
}

// URL is the page's address for a listener's address: a wildcard host
// reads as loopback, which reaches it from this machine.
func URL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}
