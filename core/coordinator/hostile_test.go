package coordinator

import (
	"context"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/internal/testutil/hostile"
)

// Every hostile input at the control server's port (garbage, 4 GiB length
// fields, a hello under another secret, a stalled handshake, silence; each
// in a burst of 100) is dropped within the handshake timeout and logged;
// the goroutines it took are returned, the heap stays flat, no log line
// holds the secret or a key, and the run the ranks then join completes.
func TestHostileConnectionsAreDropped(t *testing.T) {
	cfg := testConfig(t)
	h := newHarness(t, cfg, func(o *Options) { o.HandshakeTimeout = time.Second })
	wrongKeys, err := wire.DeriveKeys([]byte("another secret, also long enough!"))
	if err != nil {
		t.Fatal(err)
	}
	wrong := hostile.FirstWrite(func(nc net.Conn) {
		wire.ClientHandshake(context.Background(), nc, wrongKeys, wire.Hello{Rank: 0, World: h.world}, wire.WithHandshakeTimeout(time.Second))
	})
	heap0, g0 := hostile.Settle(0, 0)
	h.start()
	ctx := context.Background()
	t.Run("inputs", func(t *testing.T) {
		for _, c := range hostile.Cases(wrong) {
			t.Run(c.Name, func(t *testing.T) {
				t.Parallel()
				if err := hostile.Burst(ctx, h.addr, c, 100, 3*time.Second); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
	// The run's own goroutines: the loop, the accept loop, the harness.
	heap1, g1 := hostile.Settle(g0+4, 3*time.Second)
	t.Logf("heap %d -> %d KiB, goroutines %d -> %d", heap0>>10, heap1>>10, g0, g1)
	if g1 > g0+4 {
		t.Errorf("%d goroutines after the hostile connections, %d before the run", g1, g0)
	}
	if heap1 > heap0+4<<20 {
		t.Errorf("heap grew from %d to %d KiB", heap0>>10, heap1>>10)
	}
	for r := range h.world {
		h.rank(r, rankScript{msPerBatch: time.Millisecond})
	}
	h.mustComplete()
	logs := h.logs.String()
	if n := strings.Count(logs, "refused a rank connection"); n < 500 {
		t.Errorf("%d refusals logged, want one per hostile connection (500)", n)
	}
	for _, secret := range []string{string(testSecret), hex.EncodeToString(testSecret)} {
		if strings.Contains(logs, secret) {
			t.Fatal("the run secret appears in the coordinator's log")
		}
	}
}
