package reduceserver

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"strings"
	"sync"
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

// A hello recorded from a real rank's handshake, with its proof, replayed
// 100 times a second into that rank's server while it is connected, and
// into a later server of the same key and run before and throughout its
// formation: no replay is acknowledged (each reads the challenge at most),
// none takes the rank's slot, every real rank is admitted at its first
// try, and the cohorts average. Before the challenge, the later server
// acknowledged the replay and gave it rank 0's slot, and refused the real
// rank 0 as a duplicate.
func TestReplayedHellosHoldNoSlot(t *testing.T) {
	s1, _ := startServer(t, 2)
	r0 := mustRank(t, s1, 0, 2)
	r0.raw.mu.Lock()
	recorded := append([]byte(nil), r0.raw.handshake...)
	r0.raw.mu.Unlock()
	if len(recorded) != reduce.HelloSize+reduce.ProofSize {
		t.Fatalf("recorded %d handshake bytes, want a hello and a proof (%d)", len(recorded), reduce.HelloSize+reduce.ProofSize)
	}

	// Replays come before each real rank and go on after the round.
	const spell = 300 * time.Millisecond
	stop := flood(t, s1.Addr(), recorded)
	time.Sleep(spell)
	roundAll(t, 1, r0, mustRank(t, s1, 1, 2))
	time.Sleep(spell)
	stop()

	s2, _ := startServer(t, 2)
	stop = flood(t, s2.Addr(), recorded)
	time.Sleep(spell)
	r0 = mustRank(t, s2, 0, 2)
	time.Sleep(spell)
	roundAll(t, 1, r0, mustRank(t, s2, 1, 2))
	time.Sleep(spell)
	stop()
}

// flood replays a recorded handshake at addr 100 times a second until
// stop, which returns once every replay has ended and fails the test if
// any read more than a challenge. Half the replays send the recorded proof
// with the hello; the others send the hello alone and wait.
func flood(t *testing.T, addr string, recorded []byte) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var replays, acked int
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			send := recorded[:reduce.HelloSize]
			if i%2 == 0 {
				send = recorded
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := replay(addr, send)
				mu.Lock()
				defer mu.Unlock()
				replays++
				if len(got) > reduce.ChallengeSize {
					acked++
					t.Errorf("a replayed hello read %d bytes (%v): more than a challenge", len(got), err)
				}
			}()
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		t.Logf("%d replays, %d answered beyond a challenge", replays, acked)
		if replays == 0 {
			t.Error("no replay was sent")
		}
	}
}

// replay sends b on a new connection to addr and returns what comes back
// until the server closes it.
func replay(addr string, b []byte) ([]byte, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if _, err := nc.Write(b); err != nil {
		return nil, err
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	return io.ReadAll(nc)
}
