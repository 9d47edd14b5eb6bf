package reduceserver

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugintest"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/reduce"
)

var (
	key      = []byte("an averaging data key, 32 bytes!")
	wrongKey = []byte("another data key, also 32 bytes!")
)

const runID = "run-1"

func startServer(t *testing.T, world uint32) (*Server, *plugintest.LogBuffer) {
	t.Helper()
	logs := &plugintest.LogBuffer{}
	s, err := Listen(context.Background(), Config{
		Addr: "127.0.0.1:0", Key: key, RunID: runID, World: world, Timeout: 3 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return s, logs
}

// tamperConn lets a test corrupt what a rank writes after its handshake,
// and keeps the handshake's bytes (its hello and proof).
type tamperConn struct {
	net.Conn
	mu        sync.Mutex
	writes    int
	handshake []byte
	hook      func(n int, b []byte) []byte // n counts writes; 0 is the hello, 1 the proof
}

func (c *tamperConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	n := c.writes
	c.writes++
	if n < 2 {
		c.handshake = append(c.handshake, b...)
	}
	hook := c.hook
	c.mu.Unlock()
	if hook != nil {
		if out := hook(n, append([]byte(nil), b...)); out != nil {
			if _, err := c.Conn.Write(out); err != nil {
				return 0, err
			}
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

func testHello(rank, world uint32) reduce.Hello {
	return reduce.Hello{Rank: rank, World: world, Wire: reduce.WireF32, Params: 10, Buffers: 2,
		Run: reduce.RunDigest(runID), Layout: sha256.Sum256([]byte("layout")), Host: [16]byte{1}}
}

// testRank speaks the protocol by hand, as one rank of a single host.
type testRank struct {
	t      *testing.T
	rank   uint32
	conn   *reduce.Conn
	raw    *tamperConn
	frames chan reduce.Frame
	errs   chan error
}

func dialRank(t *testing.T, s *Server, h reduce.Hello, k []byte) (*testRank, error) {
	t.Helper()
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	raw := &tamperConn{Conn: nc}
	keys, err := reduce.DeriveKeys(k)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := reduce.ClientHandshake(context.Background(), raw, keys, h, reduce.Options{Timeout: 3 * time.Second})
	if err != nil {
		return nil, err
	}
	r := &testRank{t: t, rank: h.Rank, conn: conn, raw: raw, frames: make(chan reduce.Frame, 64), errs: make(chan error, 1)}
	t.Cleanup(func() { conn.Close() })
	go func() {
		for {
			f, err := conn.Receive()
			if err != nil {
				r.errs <- err
				return
			}
			f.Payload = append([]byte(nil), f.Payload...)
			r.frames <- f
		}
	}()
	return r, nil
}

func mustRank(t *testing.T, s *Server, rank, world uint32) *testRank {
	t.Helper()
	r, err := dialRank(t, s, testHello(rank, world), key)
	if err != nil {
		t.Fatalf("rank %d: %v", rank, err)
	}
	r.join()
	return r
}

func (r *testRank) join() {
	if err := r.conn.Send(context.Background(), reduce.KindJoin, reduce.Join{ArenaPath: fmt.Sprintf("/dev/shm/test-%d", r.rank), PID: 1, RingPort: 1}.Encode()); err != nil {
		r.t.Fatal(err)
	}
}

func (r *testRank) next(kinds ...reduce.Kind) (reduce.Frame, error) {
	timeout := time.After(5 * time.Second)
	for {
		select {
		case f := <-r.frames:
			for _, k := range kinds {
				if f.Kind == k {
					return f, nil
				}
			}
			if f.Kind == reduce.KindTopology {
				continue
			}
			return f, fmt.Errorf("rank %d: unexpected %v", r.rank, f.Kind)
		case err := <-r.errs:
			return reduce.Frame{}, err
		case <-timeout:
			return reduce.Frame{}, fmt.Errorf("rank %d: no %v within 5s", r.rank, kinds)
		}
	}
}

// round runs one single-host round and returns the result.
func (r *testRank) round(id, steps uint64) (reduce.Result, error) {
	w := float64(steps)
	if err := r.conn.Send(context.Background(), reduce.KindAnnounce, reduce.Announce{Round: id, Steps: steps, Weight: w}.Encode()); err != nil {
		return reduce.Result{}, err
	}
	f, err := r.next(reduce.KindPlan, reduce.KindFail)
	if err != nil {
		return reduce.Result{}, err
	}
	if f.Kind == reduce.KindFail {
		m, _ := reduce.DecodeFail(f.Payload)
		return reduce.Result{}, errors.New(m.Reason)
	}
	p, err := reduce.DecodePlan(f.Payload)
	if err != nil {
		return reduce.Result{}, err
	}
	if !p.Realized {
		return reduce.Result{Round: id}, nil
	}
	d := reduce.Done{Round: id, Post2: 1}
	for _, q := range p.Parts {
		d.Parts = append(d.Parts, reduce.Partial{Rank: q.Rank, Diff2: float64(r.rank), Pre2: 2})
	}
	if err := r.conn.Send(context.Background(), reduce.KindDone, d.Encode()); err != nil {
		return reduce.Result{}, err
	}
	if f, err = r.next(reduce.KindResult, reduce.KindFail); err != nil {
		return reduce.Result{}, err
	}
	if f.Kind == reduce.KindFail {
		m, _ := reduce.DecodeFail(f.Payload)
		return reduce.Result{}, errors.New(m.Reason)
	}
	return reduce.DecodeResult(f.Payload)
}

func roundAll(t *testing.T, id uint64, ranks ...*testRank) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(ranks))
	res := make([]reduce.Result, len(ranks))
	for i, r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = r.round(id, 1)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d, round %d: %v", ranks[i].rank, id, err)
		}
	}
	// Each rank's sums come back summed over every participant's slice.
	for _, r := range res {
		if r.Post2 != float64(len(ranks)) || r.Pre2 != float64(2*len(ranks)) {
			t.Fatalf("result %+v for %d ranks", r, len(ranks))
		}
	}
}

// TestRoundsAndResults: the barrier and the sums of a single-host cohort.
func TestRoundsAndResults(t *testing.T) {
	s, _ := startServer(t, 3)
	rs := []*testRank{mustRank(t, s, 0, 3), mustRank(t, s, 1, 3), mustRank(t, s, 2, 3)}
	for id := uint64(1); id <= 3; id++ {
		roundAll(t, id, rs...)
	}
	if st := s.Stats(); st.Rounds != 3 || st.Connected != 3 || st.BulkBytes != 0 {
		t.Fatalf("stats %+v (a single host moves no bulk data)", st)
	}
}

// TestMisbehavingConnections: a tampered frame, a wrong-key handshake, a
// short frame and a huge declared size are each refused with a clear
// logged error, and the server goes on serving the other ranks.
func TestMisbehavingConnections(t *testing.T) {
	cases := []struct {
		name string
		// rogue misbehaves as rank 2 of 3, or (joins=false) as an outsider
		// of a 2-rank cohort.
		joins bool
		act   func(t *testing.T, s *Server)
		log   string
	}{
		{
			name: "tampered frame", joins: true, log: "authentication failed",
			act: func(t *testing.T, s *Server) {
				r := mustRank(t, s, 2, 3)
				r.raw.hook = func(n int, b []byte) []byte {
					// Only the announce: a ping the writer sends meanwhile
					// (on a busy machine) must reach the server intact.
					if len(b) > 20 && binary.LittleEndian.Uint16(b[4:]) == uint16(reduce.KindAnnounce) {
						b[len(b)-12] ^= 0x40 // a payload bit of the announce
					}
					return b
				}
				r.conn.Send(context.Background(), reduce.KindAnnounce, reduce.Announce{Round: 1, Steps: 9, Weight: 9}.Encode())
			},
		},
		{
			name: "wrong key", joins: false, log: "hello tag does not verify",
			act: func(t *testing.T, s *Server) {
				_, err := dialRank(t, s, testHello(1, 2), wrongKey)
				if err == nil || !errors.Is(err, authframe.ErrTruncated) {
					t.Fatalf("wrong-key handshake: %v", err)
				}
			},
		},
		{
			name: "short frame", joins: true, log: "truncated",
			act: func(t *testing.T, s *Server) {
				r := mustRank(t, s, 2, 3)
				r.raw.hook = func(n int, b []byte) []byte {
					r.raw.Conn.Write(b[:len(b)/2])
					r.raw.Conn.(*net.TCPConn).CloseWrite()
					return []byte{}
				}
				r.conn.Send(context.Background(), reduce.KindAnnounce, reduce.Announce{Round: 1, Steps: 9, Weight: 9}.Encode())
			},
		},
		{
			name: "huge declared size", joins: true, log: "over the limit",
			act: func(t *testing.T, s *Server) {
				r := mustRank(t, s, 2, 3)
				r.raw.hook = func(n int, b []byte) []byte {
					hdr := make([]byte, 16)
					copy(hdr, b[:8])
					for i := 8; i < 16; i++ {
						hdr[i] = 0x7f // a length of about 9e18 bytes
					}
					return hdr
				}
				r.conn.Send(context.Background(), reduce.KindAnnounce, reduce.Announce{Round: 1}.Encode())
			},
		},
		{
			name: "retired fold kind", joins: true, log: "refused",
			act: func(t *testing.T, s *Server) {
				r := mustRank(t, s, 2, 3)
				r.raw.hook = func(n int, b []byte) []byte {
					hdr := make([]byte, 16)
					copy(hdr, b[:8])
					hdr[4] = 0x04 // the star's fold, gone with version 2
					return hdr
				}
				r.conn.Send(context.Background(), reduce.KindAnnounce, reduce.Announce{Round: 1}.Encode())
			},
		},
		{
			name: "protocol violation", joins: true, log: "broke the protocol",
			act: func(t *testing.T, s *Server) {
				r := mustRank(t, s, 2, 3)
				r.conn.Send(context.Background(), reduce.KindDone, reduce.Done{Round: 77}.Encode())
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			world := uint32(2)
			if tc.joins {
				world = 3
			}
			s, logs := startServer(t, world)
			r0, r1 := mustRank(t, s, 0, world), mustRank(t, s, 1, world)
			tc.act(t, s)
			roundAll(t, 1, r0, r1)
			roundAll(t, 2, r0, r1)
			deadline := time.Now().Add(2 * time.Second)
			for !strings.Contains(logs.String(), tc.log) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Fatalf("no %q in the server log", tc.log)
			}
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, tc.log) {
					t.Log(line)
				}
			}
		})
	}
}

// TestHandshakeRefusals: the server answers a hello it refuses with a
// tagged reason the rank can report.
func TestHandshakeRefusals(t *testing.T) {
	s, _ := startServer(t, 2)
	mustRank(t, s, 0, 2)
	other := testHello(1, 2)
	other.Run = reduce.RunDigest("another run")
	layout := testHello(1, 2)
	layout.Layout[0] ^= 1
	geometry := testHello(1, 2)
	geometry.Params++
	for _, tc := range []struct {
		name string
		h    reduce.Hello
		want reduce.Status
	}{
		{"wrong world", testHello(1, 3), reduce.RefusedWorld},
		{"duplicate", testHello(0, 2), reduce.RefusedDuplicate},
		{"wrong run", other, reduce.RefusedRun},
		{"wrong layout", layout, reduce.RefusedLayout},
		{"wrong geometry", geometry, reduce.RefusedGeometry},
	} {
		_, err := dialRank(t, s, tc.h, key)
		var ref *reduce.Refusal
		if !errors.As(err, &ref) || ref.Status != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	s.MarkDead(1)
	if _, err := dialRank(t, s, testHello(1, 2), key); err == nil || !strings.Contains(err.Error(), "dead") {
		t.Errorf("dead rank admitted: %v", err)
	}
}

// TestMarkDeadDuringGathering: the barrier proceeds without a dead rank;
// MarkDead during a round in flight fails that round at once.
func TestMarkDeadDuringGathering(t *testing.T) {
	s, _ := startServer(t, 3)
	r0, r1, r2 := mustRank(t, s, 0, 3), mustRank(t, s, 1, 3), mustRank(t, s, 2, 3)
	// Round 1: rank 2 announces and plans, then dies before Done.
	done := make(chan error, 2)
	for _, r := range []*testRank{r0, r1} {
		go func() { _, err := r.round(1, 1); done <- err }()
	}
	r2.conn.Send(context.Background(), reduce.KindAnnounce, reduce.Announce{Round: 1, Steps: 1, Weight: 1}.Encode())
	if _, err := r2.next(reduce.KindPlan); err != nil {
		t.Fatal(err)
	}
	s.MarkDead(2)
	for i := 0; i < 2; i++ {
		if err := <-done; err == nil || !strings.Contains(err.Error(), "rank 2 was declared dead") {
			t.Fatalf("round with a dead participant: %v", err)
		}
	}
	// Round 2 goes on without it.
	roundAll(t, 2, r0, r1)
	// Round 1 is over for good: a late announce of it is refused.
	if _, err := r0.round(1, 1); err == nil || !strings.Contains(err.Error(), "abandoned") {
		t.Fatalf("late announce: %v", err)
	}
}

// TestAbortFailsRound: a rank's abort fails the round for everyone.
func TestAbortFailsRound(t *testing.T) {
	s, _ := startServer(t, 3)
	r0, r1, r2 := mustRank(t, s, 0, 3), mustRank(t, s, 1, 3), mustRank(t, s, 2, 3)
	done := make(chan error, 2)
	for _, r := range []*testRank{r0, r1} {
		go func() { _, err := r.round(5, 1); done <- err }()
	}
	time.Sleep(50 * time.Millisecond)
	r2.conn.Send(context.Background(), reduce.KindAbort, reduce.Abort{Round: 5, Reason: "peer 9 died"}.Encode())
	for i := 0; i < 2; i++ {
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "peer 9 died") {
				t.Fatalf("aborted round: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("abort did not end the round")
		}
	}
	roundAll(t, 6, r0, r1, r2)
}

// TestCloseJoinsGoroutines: Close returns after every goroutine of the
// server, with ranks connected and a handshake half done.
func TestCloseJoinsGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	s, _ := startServer(t, 3)
	mustRank(t, s, 0, 3)
	mustRank(t, s, 1, 3)
	half, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	half.Write([]byte{1, 2, 3})
	defer half.Close()
	time.Sleep(50 * time.Millisecond)
	s.Close()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// What remains are the test ranks' own reader goroutines (their
	// connections were closed by the server and they exit too).
	if n := runtime.NumGoroutine(); n > before+4 {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// A rank whose channel breaks is news (an ERROR) while the cohort trains,
// and not once ranks have begun to say goodbye: then it leaves with the
// rest, its own goodbye lost when this side's send to it failed first.
func TestLostChannelAsTheCohortEnds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		goodbye   bool
		wantError bool
	}{
		{"while the cohort trains", false, true},
		{"after a goodbye", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, logs := startServer(t, 3)
			rs := []*testRank{mustRank(t, s, 0, 3), mustRank(t, s, 1, 3), mustRank(t, s, 2, 3)}
			roundAll(t, 1, rs...)
			if tc.goodbye {
				if err := rs[0].conn.Send(context.Background(), reduce.KindBye); err != nil {
					t.Fatal(err)
				}
				waitLog(t, logs, "rank said goodbye")
			}
			rs[1].raw.Conn.Close() // no goodbye
			waitLog(t, logs, "leaves the cohort: rank=1", "goodbye lost: rank=1")
			if got := strings.Contains(logs.String(), "[ERROR]"); got != tc.wantError {
				t.Errorf("an ERROR logged: %v, want %v:\n%s", got, tc.wantError, logs)
			}
		})
	}
}

// waitLog waits for logs to hold one of subs.
func waitLog(t *testing.T, logs *plugintest.LogBuffer, subs ...string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		for _, sub := range subs {
			if strings.Contains(logs.String(), sub) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("none of %q logged:\n%s", subs, logs)
		}
	}
}
