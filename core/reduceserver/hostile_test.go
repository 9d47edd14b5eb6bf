package reduceserver

import (
	"context"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/hostile"
	"github.com/cohortdl/cohort/shared/reduce"
)

// Every hostile input at the reduce server's port (garbage, 4 GiB length
// fields, a hello under another key, a stalled handshake, silence; one at
// a time and in a burst of each) is dropped within the server's timeout
// and logged; the goroutines it took are returned, the heap stays flat,
// no log line holds the key, and an honest rank is admitted and served
// afterwards.
func TestHostileConnectionsAreDropped(t *testing.T) {
	s, logs := startServer(t, 1)
	wrongKeys, err := reduce.DeriveKeys(wrongKey)
	if err != nil {
		t.Fatal(err)
	}
	wrong := hostile.FirstWrite(func(nc net.Conn) {
		reduce.ClientHandshake(context.Background(), nc, wrongKeys, testHello(0, 1), reduce.Options{Timeout: time.Second})
	})
	ctx := context.Background()
	// The server's Timeout is 3 s; a dropped connection goes well before
	// that, a stalled one at it.
	const within = 5 * time.Second
	heap0, g0 := hostile.Settle(0, 0)
	t.Run("inputs", func(t *testing.T) {
		for _, c := range hostile.Cases(wrong) {
			t.Run(c.Name, func(t *testing.T) {
				t.Parallel()
				if err := hostile.Burst(ctx, s.Addr(), c, 100, within); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
	heap1, g1 := hostile.Settle(g0, 5*time.Second)
	t.Logf("heap %d -> %d KiB, goroutines %d -> %d", heap0>>10, heap1>>10, g0, g1)
	if g1 > g0 {
		t.Errorf("%d goroutines left after the hostile connections, %d before", g1, g0)
	}
	if heap1 > heap0+4<<20 {
		t.Errorf("heap grew from %d to %d KiB", heap0>>10, heap1>>10)
	}
	if n := strings.Count(logs.String(), "refused a data-channel connection"); n < 500 {
		t.Errorf("%d refusals logged, want one per hostile connection (500)", n)
	}
	for _, secret := range []string{string(key), hex.EncodeToString(key)} {
		if strings.Contains(logs.String(), secret) {
			t.Fatal("the data key appears in the server's log")
		}
	}
	r := mustRank(t, s, 0, 1)
	if _, err := r.round(1, 1); err != nil {
		t.Fatalf("an honest rank after the hostile ones: %v", err)
	}
}
