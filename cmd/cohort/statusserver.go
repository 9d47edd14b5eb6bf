package main

import (
	"context"
	"fmt"
	"net"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/status"
)

// httpFlag adds --http, which overrides the config's coordinator.http.
func httpFlag(cmd *cobra.Command, addr *string) {
	cmd.Flags().StringVar(addr, "http", "", `status page, /api/v1/status and /metrics on HOST:PORT (default: the config's coordinator.http, 127.0.0.1:0; "" for none)`)
}

// applyHTTPFlag puts --http into cfg when it was given.
func applyHTTPFlag(cmd *cobra.Command, cfg *config.Config, addr string) error {
	if !cmd.Flags().Changed("http") {
		return nil
	}
	cfg.Coordinator.HTTP = addr
	if err := cfg.Validate(); err != nil {
		return usageError("--http: %v", err)
	}
	return nil
}

// startStatus serves coord's status on addr until stop is called and says
// where on prog; with addr "" it serves nothing. On error coord is closed
// statusSource is the coordinator a status server shows (Status) and
// closes when it cannot start.
type statusSource interface {
	Status() *status.Snapshot
	Close() error
}

// (it will not run). stop ends the server and waits for it.
func startStatus(addr string, coord statusSource, log hclog.Logger, prog *progressPrinter) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		coord.Close()
		return nil, failed(fmt.Errorf("status server: listen on %s: %w", addr, err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := status.Serve(ctx, ln, coord.Status); err != nil {
			log.Warn("status server ended", "error", err)
		}
	}()
	prog.line("status page: " + status.URL(ln.Addr()))
	return func() { cancel(); <-done }, nil
}
