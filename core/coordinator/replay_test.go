package coordinator

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire"
)

// recorder keeps every byte written through a connection, as a wiretap on
// the rank's side of the link would.
type recorder struct {
	net.Conn
	mu   sync.Mutex
	sent []byte
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.sent = append(r.sent, b...)
	r.mu.Unlock()
	return r.Conn.Write(b)
}

// recordHello joins h's run as rank with a real handshake, taps what the
// rank sends (its hello and proof), then hangs up.
func recordHello(t *testing.T, h *harness, rank uint32) []byte {
	t.Helper()
	nc, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	tap := &recorder{Conn: nc}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := wire.ClientHandshake(ctx, tap, h.keys, wire.Hello{Rank: rank, World: h.world})
	if err != nil {
		t.Fatalf("the recorded rank's handshake: %v", err)
	}
	c.Close()
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return append([]byte(nil), tap.sent...)
}

// replayer sends a recording, byte for byte, on a new connection every
// 10 ms, reads whatever comes back until the coordinator hangs up, and
// counts the replays and the bytes the coordinator answered beyond a
// challenge (an ack would be 16 of them).
type replayer struct {
	replays, answered atomic.Int64
	stop              chan struct{}
	wg                sync.WaitGroup
}

func replay(addr string, recording []byte) *replayer {
	r := &replayer{stop: make(chan struct{})}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				nc, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(5 * time.Second))
				nc.Write(recording)
				got, _ := io.ReadAll(nc)
				r.replays.Add(1)
				if len(got) > 32 {
					r.answered.Add(int64(len(got) - 32))
				}
			}()
		}
	}()
	return r
}

func (r *replayer) halt() {
	close(r.stop)
	r.wg.Wait()
}

// A hello recorded off the wire in one run, replayed at 100 connections a
// second into that run (before and throughout its formation) and into a
// later run with the same secret, is never acknowledged and never holds a
// slot: every rank joins at its first try, both runs complete, and each
// trains every sample once.
func TestReplayedHellosHoldNoSlot(t *testing.T) {
	var recording []byte
	for _, name := range []string{"the recording run", "a later run"} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Epochs = 1
			h := newHarness(t, cfg, nil)
			h.start()
			if recording == nil {
				recording = recordHello(t, h, 0)
				waitFor(t, "the recorded rank's slot to be freed", func() bool { return h.logHas("rank left before the cohort formed", "rank=0") })
			}
			r := replay(h.addr, recording)
			waitFor(t, "replays before the ranks start", func() bool { return r.replays.Load() >= 20 })
			for id := range h.world {
				h.rank(id, rankScript{})
			}
			h.mustComplete()
			r.halt()
			t.Logf("%d replays", r.replays.Load())
			if n := r.answered.Load(); n != 0 {
				t.Errorf("the coordinator answered replayed hellos with %d bytes beyond their challenges", n)
			}
			for _, f := range h.ranks {
				if f.err != nil {
					t.Errorf("rank %d: %v", f.id, f.err)
				}
			}
			if h.logHas("has already joined") {
				t.Error("a rank was refused its slot")
			}
			h.ledger.checkExactlyOnce(t, 1, 96)
		})
	}
}
