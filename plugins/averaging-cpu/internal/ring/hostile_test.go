package ring

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/hostile"
)

// A leader's ring port drops what no honest predecessor sends (garbage,
// 4 GiB lengths, a hello under another data key, a cut-off or silent
// handshake), a hundred at a time, keeps no goroutine or memory for them,
// and still gives an honest predecessor its link.
func TestHostileConnectionsAreDropped(t *testing.T) {
	k, err := DeriveKeys(testKey)
	if err != nil {
		t.Fatal(err)
	}
	wrongKeys, err := DeriveKeys([]byte("another run's data key, 32 bytes"))
	if err != nil {
		t.Fatal(err)
	}
	const timeout = time.Second
	l, err := Listen("127.0.0.1:0", k, [16]byte{1}, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", l.Port())
	hello := Hello{From: 0, To: 1, Hosts: 2, Topology: 1, Round: 9, Run: [16]byte{1}}
	wrong := hello.encode(wrongKeys, [16]byte{7}) // a hello under another data key
	ctx := context.Background()
	heap0, g0 := hostile.Settle(0, 0)
	for _, c := range hostile.Cases(wrong) {
		t.Run(c.Name, func(t *testing.T) {
			if err := hostile.Burst(ctx, addr, c, 100, 3*timeout); err != nil {
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
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := Dial(dctx, addr, k, hello, timeout)
	if err != nil {
		t.Fatalf("an honest predecessor after the hostile ones: %v", err)
	}
	defer out.Close()
	in, err := l.Accept(dctx, 0, 1, 9)
	if err != nil {
		t.Fatalf("the honest link was not handed to its round: %v", err)
	}
	in.Close()
}
