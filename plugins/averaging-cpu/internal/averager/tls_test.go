package averager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/mtls"
)

// tlsCluster writes a cluster's TLS files (hosts coord and node, valid on
// loopback), as `cohort tls init` does.
func tlsCluster(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := mtls.WriteCluster(dir, []string{"coord", "node"}, mtls.Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A rank whose certificate the reduce server does not trust, or that
// brings none, is refused, and both ends say why.
func TestTLSRefusals(t *testing.T) {
	other := tlsCluster(t)
	foreign := mtls.HostFiles(other, "node")
	for _, tc := range []struct {
		name      string
		files     *mtls.Files
		rankSays  string
		rankIs    error
		serverLog string
	}{
		{"certificate from another CA", &foreign,
			"the reduce server's TLS certificate did not verify", mtls.ErrPeerCertificate, "the rank refused"},
		{"no TLS", nil, "reduce server", nil, "does not speak TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCohort(t, cohortOpts{world: 2, tls: tlsCluster(t)})
			// A third averager joins a world of two under the rank's files:
			// the server refuses it before it can say anything.
			a := New(hclog.NewNullLogger())
			defer a.Shutdown(context.Background())
			cfg := c.config(0, map[string]any{"connect_timeout": "2s"})
			cfg.TLS = tc.files
			_, err := a.Configure(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.rankSays) || (tc.rankIs != nil && !errors.Is(err, tc.rankIs)) {
				t.Errorf("rank: %v, want it to say %q", err, tc.rankSays)
			}
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(c.log.String(), tc.serverLog) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if !strings.Contains(c.log.String(), "refused a data-channel connection: TLS") || !strings.Contains(c.log.String(), tc.serverLog) {
				t.Errorf("server log does not say %q:\n%s", tc.serverLog, c.log.String())
			}
		})
	}
}
