package averager

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/plugins/averaging-cpu/internal/ring"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// TestWeightedMean runs rounds on one host (shared memory) and on ranks
// forced to be hosts of their own (every byte over TCP, f32 and bf16), and
// checks every rank's arena against a float64 reference: parameters
// weighted by steps^gamma, f32 buffers averaged among ranks that trained,
// non-f32 buffers untouched, idle ranks weighing nothing, an all-idle round
// leaving every rank its own values, and the divergence figures.
func TestWeightedMean(t *testing.T) {
	cases := []struct {
		name  string
		world int
		host  func(r int) string
		wire  string
		gamma float64
		steps []uint64
		tol   float64
		tls   bool
	}{
		{name: "shm/equal", world: 3, steps: []uint64{5, 5, 5}, gamma: 1, tol: 1e-6},
		{name: "shm/weighted", world: 4, steps: []uint64{1, 2, 3, 10}, gamma: 1, tol: 1e-6},
		{name: "shm/idle-ranks", world: 4, steps: []uint64{0, 7, 0, 3}, gamma: 1, tol: 1e-6},
		{name: "shm/gamma-half", world: 3, steps: []uint64{4, 9, 16}, gamma: 0.5, tol: 1e-6},
		{name: "shm/all-idle", world: 3, steps: []uint64{0, 0, 0}, gamma: 1},
		{name: "shm/one-rank", world: 1, steps: []uint64{3}, gamma: 1, tol: 1e-6},
		{name: "tcp/f32", world: 3, host: func(int) string { return "rank" }, steps: []uint64{2, 0, 5}, gamma: 1, tol: 1e-6},
		{name: "tcp/f32-gamma2", world: 2, host: func(int) string { return "rank" }, steps: []uint64{3, 1}, gamma: 2, tol: 1e-6},
		{name: "tcp/bf16", world: 3, host: func(int) string { return "rank" }, wire: "bf16", steps: []uint64{1, 2, 3}, gamma: 1, tol: 8e-3},
		{name: "tcp/f32-tls", world: 3, host: func(int) string { return "rank" }, steps: []uint64{2, 1, 5}, gamma: 1, tol: 1e-6, tls: true},
		{name: "tcp/all-idle", world: 2, host: func(int) string { return "rank" }, steps: []uint64{0, 0}, gamma: 1},
		{name: "mixed/2x2-f32", world: 4, host: func(r int) string { return []string{"a", "a", "b", "b"}[r] }, steps: []uint64{1, 4, 0, 2}, gamma: 1, tol: 1e-6},
		{name: "tcp/4-hosts", world: 4, host: func(int) string { return "rank" }, steps: []uint64{1, 2, 3, 4}, gamma: 1, tol: 1e-6},
		{name: "tcp/5-hosts-idle", world: 5, host: func(int) string { return "rank" }, steps: []uint64{0, 3, 0, 1, 2}, gamma: 1, tol: 1e-6},
		{name: "mixed/4-hosts-bf16-idle-host", world: 5, host: func(r int) string { return []string{"a", "b", "c", "d", "a"}[r] }, wire: "bf16", steps: []uint64{1, 0, 2, 5, 3}, gamma: 1, tol: 8e-3},
		{name: "mixed/2+1-bf16", world: 3, host: func(r int) string { return []string{"a", "b", "a"}[r] }, wire: "bf16", steps: []uint64{3, 3, 1}, gamma: 1, tol: 8e-3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sets := make([]map[string]any, tc.world)
			for r := range sets {
				// The plain mean: no smoothing across rounds.
				sets[r] = map[string]any{"gamma": tc.gamma, "smoothing": 0}
				if tc.host != nil {
					sets[r]["host"] = tc.host(r)
				}
				if tc.wire != "" {
					sets[r]["wire"] = tc.wire
				}
			}
			o := cohortOpts{world: tc.world, settings: sets, scale: 3}
			if tc.tls {
				o.tls = tlsCluster(t)
			}
			c := newCohort(t, o)
			for round := uint64(1); round <= 2; round++ {
				c.fill(round)
				pre := c.snapshot()
				ref := reference(c.layout, pre, tc.steps, tc.gamma)
				res, errs := c.roundAll(context.Background(), sameRound(tc.world, plugin.Round{Round: round}, tc.steps))
				for r, err := range errs {
					if err != nil {
						t.Fatalf("round %d rank %d: %v", round, r, err)
					}
				}
				idle := true
				for _, s := range tc.steps {
					idle = idle && s == 0
				}
				post := c.snapshot()
				for r := range c.maps {
					if res[r].Realized == idle {
						t.Fatalf("rank %d: Realized = %v with steps %v", r, res[r].Realized, tc.steps)
					}
					if w := gammaMass(tc.steps[r], tc.gamma); math.Abs(res[r].Weight-w) > 1e-12*w {
						t.Errorf("rank %d: Weight %v, want %v", r, res[r].Weight, w)
					}
					for i, e := range c.layout.Entries {
						switch {
						case e.DType != arena.F32:
							b, _ := c.maps[r].Tensor(i)
							for _, x := range b {
								if x != byte(r+1) {
									t.Fatalf("rank %d: non-f32 buffer %q changed", r, e.Name)
								}
							}
						case idle:
							for k, x := range post[r][i] {
								if x != pre[r][i][k] {
									t.Fatalf("all-idle round changed rank %d's %q[%d]: %v -> %v", r, e.Name, k, pre[r][i][k], x)
								}
							}
						default:
							if re := relErr(post[r][i], ref[i]); re > tc.tol {
								t.Errorf("rank %d %q: relative error %.3g over %.3g", r, e.Name, re, tc.tol)
							}
						}
					}
					checkFigures(t, c, r, res[r], pre, post, idle)
				}
			}
		})
	}
}

// checkFigures compares a rank's divergence figures with ones computed
// here over its parameters.
func checkFigures(t *testing.T, c *cohort, r int, res plugin.RoundResult, pre, post [][][]float32, idle bool) {
	t.Helper()
	var d2, p2, q2 float64
	for i, e := range c.layout.Entries {
		if e.Role != arena.Parameter {
			continue
		}
		for k := range pre[r][i] {
			a, b := float64(pre[r][i][k]), float64(post[r][i][k])
			d2 += (a - b) * (a - b)
			p2 += a * a
			q2 += b * b
		}
	}
	div := 0.0
	if q2 > 0 {
		div = math.Sqrt(d2 / q2)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-4*math.Max(1, math.Abs(want)) }
	if !near(res.PreNorm, math.Sqrt(p2)) || !near(res.PostNorm, math.Sqrt(q2)) || !near(res.Divergence, div) {
		t.Errorf("rank %d figures: divergence %v pre %v post %v; want %v %v %v", r, res.Divergence, res.PreNorm, res.PostNorm, div, math.Sqrt(p2), math.Sqrt(q2))
	}
	if idle && res.Divergence != 0 {
		t.Errorf("rank %d: idle round with divergence %v", r, res.Divergence)
	}
}

// TestBroadcast: every rank ends with the root's values, on one host and
// across hosts, and under a session roots are session ranks.
func TestBroadcast(t *testing.T) {
	for _, host := range []string{"", "rank"} {
		t.Run("host="+host, func(t *testing.T) {
			sets := []map[string]any{{"host": host, "wire": "bf16"}, {"host": host, "wire": "bf16"}, {"host": host, "wire": "bf16"}}
			c := newCohort(t, cohortOpts{world: 3, settings: sets, scale: 2})
			c.fill(7)
			pre := c.snapshot()
			res, errs := c.roundAll(context.Background(), sameRound(3, plugin.Round{Round: 0, Broadcast: true, Root: 1, Steps: 3}, nil))
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if !res[r].Realized {
					t.Fatalf("rank %d: broadcast not realized", r)
				}
			}
			post := c.snapshot()
			for r := range post {
				for i, e := range c.layout.Entries {
					if e.DType != arena.F32 {
						continue
					}
					for k := range post[r][i] {
						if post[r][i][k] != pre[1][i][k] {
							t.Fatalf("rank %d %q[%d] = %v, root has %v (broadcast must be exact, even with a bf16 wire)", r, e.Name, k, post[r][i][k], pre[1][i][k])
						}
					}
				}
			}
			if res[1].Divergence != 0 || res[0].Divergence == 0 {
				t.Errorf("divergences %v %v", res[0].Divergence, res[1].Divergence)
			}
		})
	}
}

// TestOuterOptimizers runs SlowMo and DiLoCo over several rounds and checks
// each round's arena against the update computed here in float64 from the
// plain consensus.
func TestOuterOptimizers(t *testing.T) {
	for _, tc := range []struct {
		outer  string
		lr, mu float64
		host   string
		// smoothing, when set, is configured instead of outer: it must
		// step as slowmo with lr 1-s, mu s.
		smoothing float64
	}{
		{"slowmo", 1.0, 0.9, "", 0},
		{"diloco", 0.7, 0.9, "", 0},
		{"diloco", 0.5, 0.5, "rank", 0},
		{"slowmo", 0.75, 0.25, "", 0.25},
		{"slowmo", 0.5, 0.5, "rank", 0.5},
	} {
		t.Run(fmt.Sprintf("%s/%s/smoothing=%v", tc.outer, tc.host, tc.smoothing), func(t *testing.T) {
			sets := make([]map[string]any, 2)
			for r := range sets {
				sets[r] = map[string]any{"outer": tc.outer, "outer_lr": tc.lr, "outer_momentum": tc.mu, "host": tc.host}
				if tc.smoothing > 0 {
					sets[r] = map[string]any{"smoothing": tc.smoothing, "host": tc.host}
				}
			}
			c := newCohort(t, cohortOpts{world: 2, settings: sets})
			steps := []uint64{1, 3}
			var prev, vel [][]float64
			for round := uint64(1); round <= 4; round++ {
				c.fill(100 + round)
				pre := c.snapshot()
				cons := reference(c.layout, pre, steps, 1)
				res, errs := c.roundAll(context.Background(), sameRound(2, plugin.Round{Round: round}, steps))
				for r, err := range errs {
					if err != nil {
						t.Fatalf("round %d rank %d: %v", round, r, err)
					}
				}
				want := make([][]float64, len(cons))
				if prev == nil {
					prev, vel = make([][]float64, len(cons)), make([][]float64, len(cons))
				}
				for i, e := range c.layout.Entries {
					if cons[i] == nil {
						continue
					}
					want[i] = append([]float64(nil), cons[i]...)
					if e.Role != arena.Parameter {
						continue
					}
					if prev[i] == nil { // first window: seed
						prev[i] = append([]float64(nil), cons[i]...)
						vel[i] = make([]float64, len(cons[i]))
						continue
					}
					for k := range want[i] {
						g := prev[i][k] - cons[i][k]
						vel[i][k] = tc.mu*vel[i][k] + g
						if tc.outer == "slowmo" {
							want[i][k] = prev[i][k] - tc.lr*vel[i][k]
						} else {
							want[i][k] = prev[i][k] - tc.lr*(tc.mu*vel[i][k]+g)
						}
						prev[i][k] = want[i][k]
					}
				}
				post := c.snapshot()
				for r := range post {
					for i, e := range c.layout.Entries {
						if want[i] == nil {
							continue
						}
						if re := relErr(post[r][i], want[i]); re > 1e-5 {
							t.Fatalf("round %d rank %d %q: relative error %.3g", round, r, e.Name, re)
						}
					}
					if !res[r].Realized {
						t.Fatal("not realized")
					}
				}
			}
		})
	}
}

// TestEASGDBlend: with easgd_alpha the arena holds local + a(consensus -
// local).
func TestEASGDBlend(t *testing.T) {
	sets := []map[string]any{{"easgd_alpha": 0.25}, {"easgd_alpha": 0.25}}
	c := newCohort(t, cohortOpts{world: 2, settings: sets})
	c.fill(3)
	pre := c.snapshot()
	steps := []uint64{2, 2}
	cons := reference(c.layout, pre, steps, 1)
	_, errs := c.roundAll(context.Background(), sameRound(2, plugin.Round{Round: 1}, steps))
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	post := c.snapshot()
	for r := range post {
		for i := range cons {
			if cons[i] == nil {
				continue
			}
			want := make([]float64, len(cons[i]))
			for k := range want {
				want[k] = float64(pre[r][i][k]) + 0.25*(cons[i][k]-float64(pre[r][i][k]))
			}
			if re := relErr(post[r][i], want); re > 1e-6 {
				t.Fatalf("rank %d entry %d: relative error %.3g", r, i, re)
			}
		}
	}
}

// TestSaveLoadState: the outer state survives a checkpoint: a cohort that
// loads it continues exactly as the one that saved it.
func TestSaveLoadState(t *testing.T) {
	sets := func() []map[string]any {
		return []map[string]any{{"outer": "slowmo"}, {"outer": "slowmo"}}
	}
	a := newCohort(t, cohortOpts{world: 2, settings: sets()})
	b := newCohort(t, cohortOpts{world: 2, settings: sets()})
	steps := []uint64{1, 1}
	run := func(c *cohort, round uint64) [][][]float32 {
		c.fill(round)
		_, errs := c.roundAll(context.Background(), sameRound(2, plugin.Round{Round: round}, steps))
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return c.snapshot()
	}
	run(a, 1)
	run(a, 2)
	dir := t.TempDir()
	files, err := a.avgs[0].SaveState(context.Background(), dir)
	if err != nil || len(files) != 1 {
		t.Fatalf("SaveState: %v %v", files, err)
	}
	for r := range b.avgs {
		if err := b.avgs[r].LoadState(context.Background(), dir); err != nil {
			t.Fatal(err)
		}
	}
	want := run(a, 3)
	got := run(b, 3)
	for i := range want[0] {
		for k := range want[0][i] {
			if want[0][i][k] != got[0][i][k] {
				t.Fatalf("entry %d[%d]: resumed %v, original %v", i, k, got[0][i][k], want[0][i][k])
			}
		}
	}
	// A corrupt file is refused.
	raw, _ := readFile(files[0])
	raw[len(raw)/2] ^= 1
	writeFile(t, files[0], raw)
	if err := b.avgs[0].LoadState(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("corrupt state loaded: %v", err)
	}
}

// TestAbortUnblocks: a round stuck on a rank that never arrives returns
// within the Abort call, the waiting peer's round fails too, and the
// averager stays aborted until NewSession.
func TestAbortUnblocks(t *testing.T) {
	c := newCohort(t, cohortOpts{world: 3})
	c.fill(1)
	errs := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func() {
			_, err := c.avgs[r].Average(context.Background(), plugin.Round{Round: 1, Steps: 1})
			errs <- err
		}()
	}
	time.Sleep(200 * time.Millisecond) // both wait for rank 2
	t0 := time.Now()
	c.avgs[0].Abort(context.Background(), "rank 2 died")
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			if err == nil || !(errors.Is(err, ErrAborted) || errors.Is(err, ErrRoundFailed)) {
				t.Fatalf("round ended with %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("a round stayed blocked after Abort")
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("abort took %v", d)
	}
	if _, err := c.avgs[0].Average(context.Background(), plugin.Round{Round: 2, Steps: 1}); !errors.Is(err, ErrAborted) {
		t.Fatalf("aborted averager ran a round: %v", err)
	}
	// The coordinator declares rank 2 dead and forms a new session.
	c.srv.MarkDead(2)
	sess := plugin.Session{Generation: 1, NewWorldSize: 2, Members: []uint32{0, 1}}
	for r := 0; r < 2; r++ {
		s := sess
		s.NewRank = uint32(r)
		if err := c.avgs[r].NewSession(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	c.avgs[2].Shutdown(context.Background())
	c.avgs = c.avgs[:2]
	res, errs2 := c.roundAll(context.Background(), sameRound(2, plugin.Round{Round: 3}, []uint64{1, 1}))
	for r, err := range errs2 {
		if err != nil || !res[r].Realized {
			t.Fatalf("rank %d after the new session: %v", r, err)
		}
	}
}

// TestMarkDeadLeavesBarrier: a rank declared dead at the server leaves the
// barrier; the others' round completes without it.
func TestMarkDeadLeavesBarrier(t *testing.T) {
	c := newCohort(t, cohortOpts{world: 3})
	c.fill(1)
	pre := c.snapshot()
	type out struct {
		res plugin.RoundResult
		err error
	}
	outs := make(chan out, 2)
	for r := 0; r < 2; r++ {
		go func() {
			res, err := c.avgs[r].Average(context.Background(), plugin.Round{Round: 1, Steps: 1})
			outs <- out{res, err}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	c.srv.MarkDead(2)
	for i := 0; i < 2; i++ {
		select {
		case o := <-outs:
			if o.err != nil || !o.res.Realized {
				t.Fatalf("round: %v", o.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("round did not complete after MarkDead")
		}
	}
	ref := reference(c.layout, pre[:2], []uint64{1, 1}, 1)
	post := c.snapshot()
	for r := 0; r < 2; r++ {
		for i := range ref {
			if ref[i] != nil {
				if re := relErr(post[r][i], ref[i]); re > 1e-6 {
					t.Fatalf("rank %d entry %d: %.3g", r, i, re)
				}
			}
		}
	}
	// The dead rank's own round is refused: its channel was closed.
	if _, err := c.avgs[2].Average(context.Background(), plugin.Round{Round: 2, Steps: 1}); err == nil {
		t.Fatal("dead rank ran a round")
	}
}

// TestPeerDiesMidRound: a rank whose averager goes away (its connection
// closes) while the others wait ends their round with an error, not a hang.
func TestPeerDiesMidRound(t *testing.T) {
	c := newCohort(t, cohortOpts{world: 3})
	errs := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func() {
			_, err := c.avgs[r].Average(context.Background(), plugin.Round{Round: 1, Steps: 1})
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	c.avgs[2].c.conn.Close() // the process died: its socket closes
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			// The server drops rank 2 from the barrier: the survivors'
			// round completes (rank 2 had not announced).
			if err != nil {
				t.Logf("round: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("round hung on a dead peer")
		}
	}
}

// TestRingLinkLost: when a host leader cannot be reached by its ring
// predecessor (it died between rounds; its listener is gone), every leader
// fails the round within the data timeout instead of waiting for it.
func TestRingLinkLost(t *testing.T) {
	set := map[string]any{"host": "rank", "timeout": "1s"}
	c := newCohort(t, cohortOpts{world: 3, settings: []map[string]any{set, set, set}})
	c.avgs[2].c.ring.Close()
	errs := make(chan error, 3)
	start := time.Now()
	for r := range 3 {
		go func() {
			_, err := c.avgs[r].Average(context.Background(), plugin.Round{Round: 1, Steps: 1})
			errs <- err
		}()
	}
	for range 3 {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a round completed without host 2's leader in the ring")
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("a leader still waits %v after the ring broke", time.Since(start))
		}
	}
}

// TestRingLinksKept: leaders keep their ring links across a topology's
// rounds (no connect and handshake per round); when a link breaks between
// rounds, the next round fails on every leader promptly and the one after
// runs on fresh links.
func TestRingLinksKept(t *testing.T) {
	set := map[string]any{"host": "rank", "timeout": "1s"}
	c := newCohort(t, cohortOpts{world: 3, settings: []map[string]any{set, set, set}})
	round := func(id uint64) []error {
		_, errs := c.roundAll(context.Background(), sameRound(3, plugin.Round{Round: id}, []uint64{1, 2, 3}))
		return errs
	}
	links := func() (out []*ring.Link) {
		for _, a := range c.avgs {
			out = append(out, a.c.links.out, a.c.links.in)
		}
		return out
	}
	for id := uint64(1); id <= 2; id++ {
		if err := errors.Join(round(id)...); err != nil {
			t.Fatalf("round %d: %v", id, err)
		}
	}
	first := links()
	if err := errors.Join(round(3)...); err != nil {
		t.Fatalf("round 3: %v", err)
	}
	if got := links(); !slices.Equal(got, first) || slices.Contains(got, nil) {
		t.Fatalf("links changed between rounds of one topology: %p, then %p", first, got)
	}
	c.avgs[2].c.links.out.Close() // host 2's link to host 0 breaks
	start := time.Now()
	for r, err := range round(4) {
		if err == nil {
			t.Fatalf("rank %d: round 4 completed over a broken link", r)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("round 4 took %v to fail", d)
	}
	if err := errors.Join(round(5)...); err != nil {
		t.Fatalf("round 5, after the broken link: %v", err)
	}
	for i, l := range links() {
		if l == nil || l == first[i] {
			t.Fatalf("link %d was not reopened after the failed round", i)
		}
	}
}

// TestServerDies: a round blocked on a dead reduce server fails within the
// read deadline.
func TestServerDies(t *testing.T) {
	c := newCohort(t, cohortOpts{world: 2, settings: []map[string]any{{"timeout": "1s"}, {"timeout": "1s"}}})
	errs := make(chan error, 1)
	go func() {
		_, err := c.avgs[0].Average(context.Background(), plugin.Round{Round: 1, Steps: 1})
		errs <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.srv.Close()
	select {
	case err := <-errs:
		if err == nil || !strings.Contains(err.Error(), "data channel") {
			t.Fatalf("round ended with %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("round hung on a dead server")
	}
}

func readFile(p string) ([]byte, error) { return os.ReadFile(p) }

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSoloIdentity holds Configure's SoloIdentity to the truth: on a cohort
// of one rank, whose values move between rounds as training moves them,
// rounds leave the arena bit for bit as they found it exactly when
// Configure said so. The core skips a lone rank's rounds on that word.
func TestSoloIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
		want bool
	}{
		{"defaults", nil, true},
		{"gamma and easgd", map[string]any{"gamma": 0.5, "easgd_alpha": 0.3}, true},
		{"own host over tcp", map[string]any{"host": "rank"}, true},
		{"bf16 wire", map[string]any{"wire": "bf16", "host": "rank"}, true},
		{"slowmo", map[string]any{"outer": "slowmo"}, false},
		{"diloco", map[string]any{"outer": "diloco"}, false},
		{"smoothing", map[string]any{"smoothing": 0.5}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCohort(t, cohortOpts{world: 1, settings: []map[string]any{tc.set}})
			if traits := c.traits[0]; traits.SoloIdentity != tc.want {
				t.Fatalf("SoloIdentity = %v, want %v", traits.SoloIdentity, tc.want)
			}
			c.fill(7)
			identity := true
			for round := range 4 {
				// Training between rounds.
				for i, e := range c.layout.Entries {
					if e.DType == arena.F32 {
						f, _ := c.maps[0].Float32s(i)
						for k := range f {
							f[k] += 0.01 * float32(round+k%5)
						}
					}
				}
				pre := c.snapshot()
				if _, err := c.avgs[0].Average(t.Context(), plugin.Round{Round: uint64(round), Steps: 3}); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				post := c.snapshot()
				for i := range pre[0] {
					for k := range pre[0][i] {
						if math.Float32bits(pre[0][i][k]) != math.Float32bits(post[0][i][k]) {
							identity = false
						}
					}
				}
			}
			if identity != tc.want {
				t.Errorf("lone rounds left the arena as it was: %v; Configure said %v", identity, tc.want)
			}
		})
	}
}

// The core picks the meeting point by the kind Describe declares: this
// averager's ranks must be sent to the reduce server, not the relay.
func TestDescribeMeetsAtReduceServer(t *testing.T) {
	d, err := New(nil).Describe(context.Background())
	if err != nil || d.MeetingKind() != plugin.MeetReduceServer {
		t.Fatalf("Describe = %+v, %v; want meeting kind %q", d, err, plugin.MeetReduceServer)
	}
}
