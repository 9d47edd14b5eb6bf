package coordinator

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/coordinator/meeting"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
)

// A clean sync run: the conversation follows the protocol page from Admit
// to Exiting, every sample of every epoch is trained exactly once, no plan
// exceeds sync_every batches, and the summary says what happened.
func TestSyncRunCompletes(t *testing.T) {
	cfg := testConfig(t)
	var mu sync.Mutex
	var progress []Progress
	h := newHarness(t, cfg, func(o *Options) {
		o.Progress = func(p Progress) {
			mu.Lock()
			progress = append(progress, p)
			mu.Unlock()
		}
	})
	ranks := h.startAll(func(uint32) rankScript { return rankScript{msPerBatch: time.Millisecond} })
	sum := h.mustComplete()

	const samples, batch = 96, 8
	h.ledger.checkExactlyOnce(t, 2, samples)
	for _, f := range ranks {
		if f.admit == nil || f.admit.GetSeed() != 7 || f.admit.GetEpochs() != 2 || f.admit.GetRunId() != h.coord.RunID() {
			t.Errorf("rank %d: Admit %v, want seed 7, epochs 2, run id %s", f.id, f.admit, h.coord.RunID())
		}
		roles := messagesOf[*wirepb.SetEpochCallbackRole](f)
		syncs := messagesOf[*wirepb.Sync](f)
		if len(roles) != 1 || roles[0].GetRank() != 0 {
			t.Errorf("rank %d: SetEpochCallbackRole %v, want one naming rank 0", f.id, roles)
		}
		if len(syncs) == 0 || syncs[0].GetRound() != 0 || syncs[0].GetMode() != wirepb.SyncMode_SYNC_MODE_BROADCAST || syncs[0].GetRoot() != 0 {
			t.Fatalf("rank %d: first Sync %v, want round 0 BROADCAST root 0", f.id, syncs)
		}
		for i, s := range syncs[1:] {
			if s.GetRound() != uint64(i+1) || s.GetMode() != wirepb.SyncMode_SYNC_MODE_AVERAGE {
				t.Errorf("rank %d: Sync #%d is %v, want round %d AVERAGE", f.id, i+1, s, i+1)
			}
		}
		for _, p := range f.plans {
			if p.size > uint64(cfg.Coordinator.SyncEvery*batch) {
				t.Errorf("rank %d: plan of %d samples exceeds sync_every × batch = %d", f.id, p.size, cfg.Coordinator.SyncEvery*batch)
			}
		}
		// A window's plans come with the Sync that closes the window
		// before (with the global step), not with Update a round trip
		// later; only an epoch's first window starts otherwise (round 0's
		// Update, then StartEpoch).
		carried := 0
		for _, s := range syncs {
			if s.GetNextPlan() != nil {
				carried++
				if s.GlobalStep == nil {
					t.Errorf("rank %d: Sync %d carries a plan but no global step", f.id, s.GetRound())
				}
			}
		}
		updated := 0
		for _, u := range messagesOf[*wirepb.Update](f) {
			if u.GetNextPlan() != nil {
				updated++
				if u.GetVersion() != 0 {
					t.Errorf("rank %d: Update %d carries a plan in a run without aborted rounds", f.id, u.GetVersion())
				}
			}
		}
		if starts := len(messagesOf[*wirepb.StartEpoch](f)); carried == 0 || carried+starts+updated != len(f.plans) {
			t.Errorf("rank %d: %d plans came with a Sync, %d with StartEpoch and %d with Update, of %d", f.id, carried, starts, updated, len(f.plans))
		}
		// Each window is one plan per rank: no rank runs two plans between
		// rounds.
		seen := map[int]int{}
		for _, p := range f.plans {
			seen[p.window]++
			if seen[p.window] > 1 {
				t.Errorf("rank %d: two plans in window %d", f.id, p.window)
			}
		}
		if !f.exitedOK {
			t.Errorf("rank %d did not get a clean Shutdown: %v", f.id, f.err)
		}
	}
	evals := messagesOf[*wirepb.Evaluate](ranks[0])
	if len(evals) != 2 || evals[0].GetTargetRank() != 0 || evals[1].GetEpoch() != 1 {
		t.Errorf("rank 0 Evaluate frames %v, want one per epoch targeting rank 0", evals)
	}
	if n := len(messagesOf[*wirepb.Evaluate](ranks[1])); n != 0 {
		t.Errorf("rank 1 got %d Evaluate frames; only the epoch-callback rank evaluates", n)
	}

	if sum.WorldSize != 3 || len(sum.Epochs) != 2 || len(sum.Ranks) != 3 {
		t.Fatalf("summary: world %d, %d epochs, %d ranks", sum.WorldSize, len(sum.Epochs), len(sum.Ranks))
	}
	for _, e := range sum.Epochs {
		if e.Samples != samples || e.Loss != 0.5 || e.Accuracy == nil || *e.Accuracy != 0.75 || e.Rounds == 0 {
			t.Errorf("epoch %d summary %+v: want %d samples, loss 0.5, accuracy 0.75, rounds > 0", e.Epoch, e, samples)
		}
	}
	for _, r := range sum.Ranks {
		if r.State != record.RankExited || r.Samples != 2*samples/3 {
			t.Errorf("rank summary %+v: want exited with %d samples", r, 2*samples/3)
		}
	}
	// 96 samples / 3 ranks = 32 each = 4 batches = 2 windows per epoch, plus
	// round 0.
	if sum.Averaging.Rounds != 5 || sum.Averaging.Backend != "mock" || sum.Averaging.BytesPerRound != 300 || sum.Averaging.HostCopyBytes != 5*3*7 {
		t.Errorf("averaging summary %+v: want 5 rounds of 300 bytes and 3·7 host copy bytes each, backend mock", sum.Averaging)
	}
	if sum.GlobalStep != 8 {
		t.Errorf("global step %d, want 8 (24 batches over all ranks / 3 ranks)", sum.GlobalStep)
	}
	mu.Lock()
	var kinds []ProgressKind
	for _, p := range progress {
		if p.Kind != ProgressSamples {
			kinds = append(kinds, p.Kind)
		} else if p.Total != samples || p.Done > samples {
			t.Errorf("progress %+v: done beyond the epoch's %d samples", p, samples)
		}
	}
	mu.Unlock()
	if !slices.Equal(kinds, []ProgressKind{ProgressFormed, ProgressEpoch, ProgressEpoch}) {
		t.Errorf("progress kinds %v, want formed and one per epoch", kinds)
	}
	onDisk, err := record.ReadSummary(filepath.Join(h.out, record.SummaryFile))
	if err != nil || onDisk.Status != record.StatusCompleted || len(onDisk.Epochs) != 2 {
		t.Errorf("summary.json: %+v, %v", onDisk, err)
	}
}

// Each refusal at the handshake is logged with its reason, gets no ack,
// and leaves the coordinator serving the ranks that belong.
func TestHandshakeRefusals(t *testing.T) {
	otherKeys, err := wire.DeriveKeys([]byte("another secret, not the run's one"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		// dial plays the refused peer; it returns the client-side error.
		dial func(h *harness) error
		// afterRank0: dial once rank 0 has joined (for the duplicate).
		afterRank0 bool
		logged     string
	}{
		{name: "wrong secret", logged: "authentication failed", dial: func(h *harness) error {
			return clientHello(h, otherKeys, wire.Hello{Rank: 1, World: 2})
		}},
		{name: "wrong world size", logged: "world size 3, this run has 2 ranks", dial: func(h *harness) error {
			return clientHello(h, h.keys, wire.Hello{Rank: 1, World: 3})
		}},
		{name: "duplicate rank", afterRank0: true, logged: "rank 0 has already joined", dial: func(h *harness) error {
			return clientHello(h, h.keys, wire.Hello{Rank: 0, World: 2})
		}},
		// wire's client will not send a rank outside its own world, so this
		// peer writes the hello bytes itself.
		{name: "out-of-range rank", logged: "rank 5 out of range", dial: func(h *harness) error {
			return rawHello(h, 5, 2)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Ranks = 2
			cfg.Run.Epochs = 1
			h := newHarness(t, cfg, nil)
			h.start()
			var r0 *fakeRank
			if tc.afterRank0 {
				r0 = h.rank(0, rankScript{})
				waitFor(t, "rank 0 to join", func() bool { return h.logHas("rank joined", "rank=0") })
			}
			if err := tc.dial(h); err == nil {
				t.Fatal("the coordinator acked a hello it must refuse")
			} else if !errors.Is(err, authframe.ErrTruncated) && !errors.Is(err, io.EOF) {
				t.Errorf("client side: %v, want the connection closed without an ack", err)
			}
			waitFor(t, "the refusal to be logged", func() bool { return h.logHas("refused a rank connection", tc.logged) })
			if r0 == nil {
				h.rank(0, rankScript{})
			}
			h.rank(1, rankScript{})
			h.mustComplete()
			h.ledger.checkExactlyOnce(t, 1, 96)
		})
	}
}

func clientHello(h *harness, keys wire.Keys, hello wire.Hello) error {
	nc, err := net.Dial("tcp", h.addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := wire.ClientHandshake(ctx, nc, keys, hello)
	if err == nil {
		c.Close()
	}
	return err
}

// rawHello sends a correctly tagged hello for any rank and world, built as
// core/wire documents it (a zero nonce at [16:32]; tag: HMAC-SHA256 under
// the handshake key over the first 32 bytes), and reads what comes back.
func rawHello(h *harness, rank, world uint32) error {
	nc, err := net.Dial("tcp", h.addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	var b [40]byte
	binary.LittleEndian.PutUint32(b[0:], wire.HelloMagic)
	binary.LittleEndian.PutUint32(b[4:], wire.Version)
	binary.LittleEndian.PutUint32(b[8:], rank)
	binary.LittleEndian.PutUint32(b[12:], world)
	hk := hmac.New(sha256.New, testSecret)
	hk.Write([]byte("cohort/wire/v1/handshake"))
	tag := hmac.New(sha256.New, hk.Sum(nil))
	tag.Write(b[:32])
	copy(b[32:], tag.Sum(nil))
	if _, err := nc.Write(b[:]); err != nil {
		return err
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ack [32]byte
	if _, err := io.ReadFull(nc, ack[:]); err != nil {
		return err
	}
	return nil
}

// A rank whose Ready disagrees with rank 0's is refused (its slot freed)
// and formation times out naming the reason.
func TestFormationRefusesMismatchedReady(t *testing.T) {
	cases := []struct {
		name   string
		script rankScript
		reason string
	}{
		{"layout digest", rankScript{digest: []byte("model-b")}, "layout digest"},
		{"sample count", rankScript{samples: 100}, "100 samples, rank 0's has 96"},
		{"batch size", rankScript{batch: 4}, "batch size is 4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Ranks = 2
			cfg.Coordinator.FormationTimeout = 700 * time.Millisecond
			h := newHarness(t, cfg, nil)
			h.start()
			h.rank(0, rankScript{})
			h.rank(1, tc.script)
			sum, err := h.wait()
			if err == nil || sum.Status != record.StatusFailed {
				t.Fatalf("status %s, error %v: want a failed formation", statusOf(sum), err)
			}
			if !strings.Contains(err.Error(), "1/2 ranks ready") || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("error %q does not say 1/2 ranks ready and %q", err, tc.reason)
			}
			if !h.logHas("refused a rank at formation", "rank=1") {
				t.Error("the refusal was not logged")
			}
		})
	}
}

// Formation fails after the timeout when a rank never joins.
func TestFormationTimeout(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.FormationTimeout = 500 * time.Millisecond
	h := newHarness(t, cfg, nil)
	h.start()
	h.rank(0, rankScript{})
	h.rank(2, rankScript{})
	start := time.Now()
	sum, err := h.wait()
	if err == nil || !strings.Contains(err.Error(), "2/3 ranks ready") {
		t.Fatalf("error %v, want a formation failure with 2/3 ranks ready", err)
	}
	// The bound only has to tell the configured 500 ms from the default
	// 60 s, with room for a loaded machine.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("formation failure took %v, as if formation_timeout = 500ms were not applied", d)
	}
	if sum.Status != record.StatusFailed || sum.Ranks[1].State != record.RankDead || sum.Ranks[1].Reason != "never joined the cohort" {
		t.Errorf("summary %+v", sum)
	}
}

// TestExitDeadline: a rank that never answers Shutdown, though it still
// heartbeats, is declared dead once ExitTimeout has passed, and the run ends
// then rather than waiting on it.
func TestExitDeadline(t *testing.T) {
	cfg := testConfig(t)
	cfg.Run.Epochs = 1
	h := newHarness(t, cfg, func(o *Options) { o.ExitTimeout = 300 * time.Millisecond })
	h.startAll(func(r uint32) rankScript { return rankScript{ignoreShutdown: r == 1} })
	sum, err := h.wait()
	if err != nil {
		t.Fatalf("the run failed: %v", err)
	}
	if sum.Status != record.StatusCompleted {
		t.Fatalf("status %q", sum.Status)
	}
	for _, rk := range sum.Ranks {
		want := record.RankExited
		if rk.Rank == 1 {
			want = record.RankDead
		}
		if rk.State != want || (rk.Rank == 1 && !strings.Contains(rk.Reason, "no Exiting within 300ms of Shutdown")) {
			t.Errorf("rank %d: %s (%q), want %s", rk.Rank, rk.State, rk.Reason, want)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A rank asks for its averager's meeting point by kind, never by name: the
// reduce-server kind gets the coordinator's own reduce server on the control
// listener's host (closed when the run ends), the relay kind an empty
// endpoint, a kind Options.Meetings
// adds gets its point (which hears of deaths), and an unknown kind or a
// kind other than the cohort's is refused with a reason.
func TestMeetingKinds(t *testing.T) {
	cases := []struct {
		name     string
		kinds    []string // per rank
		extra    map[string]meeting.Factory
		wantErr  []string // per rank: "" for an endpoint
		endpoint func(t *testing.T, ep string)
	}{
		{name: "relay", kinds: []string{"relay", "relay"}, wantErr: []string{"", ""},
			endpoint: func(t *testing.T, ep string) {
				if ep != "" {
					t.Errorf("relay endpoint %q, want none", ep)
				}
			}},
		{name: "reduce server", kinds: []string{"reduce-server", "reduce-server"}, wantErr: []string{"", ""},
			endpoint: func(t *testing.T, ep string) {
				if host, port, err := net.SplitHostPort(ep); err != nil || host != "127.0.0.1" || port == "0" {
					t.Errorf("reduce server endpoint %q, want 127.0.0.1:<port>", ep)
					return
				}
				// Checked once the run has ended: the meeting point
				// must not outlive it.
				if conn, err := net.Dial("tcp", ep); err == nil {
					conn.Close()
					t.Errorf("the reduce server at %s still listens after the run", ep)
				}
			}},
		{name: "added kind", kinds: []string{"fabric", "fabric"}, wantErr: []string{"", ""},
			extra: map[string]meeting.Factory{"fabric": func(meeting.Env) (meeting.Point, error) { return &fixedEndpoint{addr: "10.0.0.1:7000"}, nil }},
			endpoint: func(t *testing.T, ep string) {
				if ep != "10.0.0.1:7000" {
					t.Errorf("added kind's endpoint %q, want its point's", ep)
				}
			}},
		{name: "unknown kind", kinds: []string{"carrier-pigeon", "carrier-pigeon"}, wantErr: []string{`no meeting kind "carrier-pigeon"`, `no meeting kind "carrier-pigeon"`}},
		{name: "kinds disagree", kinds: []string{"relay", "reduce-server"}, wantErr: []string{"", `meets by "reduce-server", but the cohort's ranks before it asked for "relay"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Ranks, cfg.Run.Epochs = 2, 1
			h := newHarness(t, cfg, func(o *Options) { o.Meetings = tc.extra })
			h.start()
			// Rank 1 asks only once rank 0 has its answer, so "the
			// cohort's first kind" is rank 0's.
			f0 := h.rank(0, rankScript{meet: tc.kinds[0], msPerBatch: time.Millisecond})
			waitFor(t, "rank 0's Meeting", func() bool { return len(messagesOf[*wirepb.Meeting](f0)) == 1 })
			f1 := h.rank(1, rankScript{meet: tc.kinds[1], msPerBatch: time.Millisecond})
			h.mustComplete()
			for i, f := range []*fakeRank{f0, f1} {
				got := messagesOf[*wirepb.Meeting](f)
				if len(got) != 1 || got[0].GetKind() != tc.kinds[i] {
					t.Fatalf("rank %d: Meeting answers %v, want one for %q", i, got, tc.kinds[i])
				}
				switch want := tc.wantErr[i]; {
				case want == "" && got[0].GetError() != "":
					t.Errorf("rank %d refused: %s", i, got[0].GetError())
				case want != "" && !strings.Contains(got[0].GetError(), want):
					t.Errorf("rank %d: error %q, want it to contain %q", i, got[0].GetError(), want)
				case want == "" && tc.endpoint != nil:
					tc.endpoint(t, got[0].GetEndpoint())
				}
			}
		})
	}
}

// The reduce server listens on coordinator.reduce_port when it is set, so
// a firewall can be opened for it.
func TestReduceServerOnConfiguredPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	cfg := testConfig(t)
	cfg.Run.Ranks, cfg.Run.Epochs = 1, 1
	cfg.Coordinator.ReducePort, _ = strconv.Atoi(port)
	h := newHarness(t, cfg, nil)
	h.start()
	f := h.rank(0, rankScript{meet: "reduce-server", msPerBatch: time.Millisecond})
	h.mustComplete()
	got := messagesOf[*wirepb.Meeting](f)
	if len(got) != 1 || got[0].GetEndpoint() != "127.0.0.1:"+port {
		t.Fatalf("Meeting %v, want the reduce server at 127.0.0.1:%s", got, port)
	}
}

type fixedEndpoint struct {
	addr string
	mu   sync.Mutex
	dead []uint32
}

func (e *fixedEndpoint) Endpoint() string { return e.addr }
func (e *fixedEndpoint) Close() error     { return nil }

func (e *fixedEndpoint) MarkDead(rank uint32) {
	e.mu.Lock()
	e.dead = append(e.dead, rank)
	e.mu.Unlock()
}

// Frames a rank should not send (a second Ready, answers to questions
// never asked, Metrics for plans it does not hold, NaN and infinite
// figures) are ignored: the rank stays in the cohort, the run completes
// and its summary is valid JSON with finite numbers.
func TestHostileFramesAreShrugged(t *testing.T) {
	cfg := testConfig(t)
	h := newHarness(t, cfg, nil)
	h.startAll(func(r uint32) rankScript { return rankScript{junk: r == 1, msPerBatch: time.Millisecond} })
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, 96)
	if len(sum.MembershipEvents) != 0 || sum.Ranks[1].State != record.RankExited {
		t.Fatalf("the junk-sending rank was dropped: %+v", sum.MembershipEvents)
	}
	for _, e := range sum.Epochs {
		if e.Loss != 0.5 {
			t.Errorf("epoch %d loss %v: an infinite loss must not poison the mean", e.Epoch, e.Loss)
		}
	}
	if _, err := record.ReadSummary(filepath.Join(h.out, record.SummaryFile)); err != nil {
		t.Fatal(err)
	}
	if !h.logHas("ignoring a SyncAck for no round in flight") || !h.logHas("ignoring Metrics for a plan the rank does not hold") {
		t.Error("the ignored frames were not logged")
	}
}

// A cohort of one rank whose averager's lone round is the identity runs no
// rounds after round 0; its plans grow to about 200 ms of its measured
// batch time (read from merged Batch frames), let its Batch reports merge,
// and its next plan always waits queued behind the one it trains; the
// global step counts every merged batch. Without that word from the averager the rounds run. A trainer
// without a test split is not asked to evaluate.
func TestSoloCohort(t *testing.T) {
	for _, tc := range []struct {
		name         string
		solo, noEval bool
	}{
		{"solo", true, false},
		{"solo without test split", true, true},
		{"lone rounds", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Ranks = 1
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(func(uint32) rankScript {
				return rankScript{msPerBatch: 60 * time.Millisecond, solo: tc.solo, noEval: tc.noEval}
			})
			sum := h.mustComplete()
			f := ranks[0]
			h.ledger.checkExactlyOnce(t, 2, 96)
			syncs := messagesOf[*wirepb.Sync](f)
			evals := messagesOf[*wirepb.Evaluate](f)
			steps := messagesOf[*wirepb.SetGlobalStep](f)
			f.mu.Lock()
			plans := slices.Clone(f.plans)
			f.mu.Unlock()
			if len(steps) == 0 || steps[len(steps)-1].GetGlobalStep() != 24 {
				t.Errorf("SetGlobalStep %v, want the last at 24 (2 epochs of 12 batches)", steps)
			}
			if tc.noEval != (len(evals) == 0) {
				t.Errorf("%d Evaluate with a test split: %v", len(evals), !tc.noEval)
			}
			for _, e := range sum.Epochs {
				if (e.Accuracy == nil) != tc.noEval {
					t.Errorf("epoch %d accuracy %v", e.Epoch, e.Accuracy)
				}
				// 12 batches of 60 ms, whether reported one by one or merged.
				if len(e.Ranks) != 1 || e.Ranks[0].TrainMS != 720 {
					t.Errorf("epoch %d ranks %+v, want rank 0 with 720 ms of training", e.Epoch, e.Ranks)
				}
			}
			if !tc.solo {
				for i, p := range plans {
					if p.merged {
						t.Errorf("lone rounds: plan %d let its Batch reports merge", i)
					}
				}
				if len(syncs) < 2 {
					t.Fatalf("lone rounds: %d Sync, want rounds after round 0", len(syncs))
				}
				return
			}
			if len(syncs) != 1 || syncs[0].GetRound() != 0 {
				t.Fatalf("Sync %v, want round 0 only", syncs)
			}
			grown := false
			for i, p := range plans {
				last := i == len(plans)-1 || plans[i+1].epoch != p.epoch
				// 500 ms of 60 ms batches of 8 samples: 8 batches, once
				// batch times are known; sync_every's 2 before.
				if p.size > 64 || (i < 2 && p.size != 16) {
					t.Errorf("plan %d: %d samples, want 16 before batch times are known, then at most 64", i, p.size)
				}
				grown = grown || p.size == 64
				if !p.merged {
					t.Errorf("plan %d did not let its Batch reports merge", i)
				}
				if !last && p.queued == 0 {
					t.Errorf("plan %d (epoch %d, offset %d) finished with no plan queued behind it", i, p.epoch, p.offset)
				}
			}
			if !grown {
				t.Error("no plan grew to 500 ms of batches")
			}
		})
	}
}

// A cohort that deaths leave at one rank goes solo: every sample is still
// trained exactly once, and after the death at most the round it aborted
// runs again; none follow.
func TestCohortGoesSolo(t *testing.T) {
	cfg := testConfig(t)
	cfg.Run.Ranks = 2
	cfg.Coordinator.MinRanks = 1
	cfg.Coordinator.HeartbeatTimeout = time.Second
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(r uint32) rankScript {
		s := rankScript{msPerBatch: 5 * time.Millisecond, solo: true}
		if r == 1 {
			s.dieAfterBatches = 3
		}
		return s
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, 96)
	if len(sum.MembershipEvents) != 1 || sum.MembershipEvents[0].Rank != 1 {
		t.Fatalf("membership events %+v, want rank 1's death", sum.MembershipEvents)
	}
	f := ranks[0]
	f.mu.Lock()
	received := slices.Clone(f.received)
	f.mu.Unlock()
	dead := slices.IndexFunc(received, func(m proto.Message) bool { _, ok := m.(*wirepb.DeclareDead); return ok })
	if dead < 0 {
		t.Fatal("rank 0 was not told of the death")
	}
	var after []uint64
	for _, m := range received[dead:] {
		if s, ok := m.(*wirepb.Sync); ok {
			after = append(after, s.GetRound())
		}
	}
	if len(after) > 1 {
		t.Errorf("rounds after the death: %v, want at most the aborted one again", after)
	}
}

// bulkPoint is a meeting point that counts the rounds' bulk data itself,
// as the reduce server does: 4 rounds of bytesPerRound.
type bulkPoint struct {
	fixedEndpoint
	bytesPerRound uint64
}

func (b *bulkPoint) Bulk() (rounds, bytes uint64) { return 4, 4 * b.bytesPerRound }

// The summary's bytes_per_round is the larger of what the ranks report
// (100 bytes per rank per round, 3 ranks) and what a meeting point that
// counts bulk data saw: a point that saw none (every rank on one host)
// must not zero the ranks' figure.
func TestBytesPerRound(t *testing.T) {
	for _, tc := range []struct {
		name string
		bulk uint64
		want float64
	}{
		{"the point saw nothing", 0, 300},
		{"the point saw less", 120, 300},
		{"the point saw more", 5000, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			pt := &bulkPoint{bytesPerRound: tc.bulk}
			h := newHarness(t, cfg, func(o *Options) {
				o.Meetings = map[string]meeting.Factory{"fabric": func(meeting.Env) (meeting.Point, error) { return pt, nil }}
			})
			h.startAll(func(uint32) rankScript { return rankScript{meet: "fabric", msPerBatch: time.Millisecond} })
			sum := h.mustComplete()
			if got := sum.Averaging.BytesPerRound; got != tc.want {
				t.Errorf("bytes_per_round %v, want %v", got, tc.want)
			}
		})
	}
}
