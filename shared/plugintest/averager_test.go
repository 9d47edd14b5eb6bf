package plugintest

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// avgLayout has two parameters, a float buffer and an integer buffer that
// the mock averager must leave alone.
func avgLayout(t *testing.T) arena.Layout {
	t.Helper()
	l, err := arena.Pack([]arena.Entry{
		{Name: "w", DType: arena.F32, Shape: []int64{5, 7}, Role: arena.Parameter},
		{Name: "stats", DType: arena.F32, Shape: []int64{6}, Role: arena.Buffer},
		{Name: "steps", DType: arena.I64, Shape: []int64{2}, Role: arena.Buffer},
		{Name: "b", DType: arena.F32, Shape: []int64{3}, Role: arena.Parameter},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// avgRank is one in-process rank: its arena and its averager.
type avgRank struct {
	arena *arena.Owned
	avg   *Averager
}

// avgGroup configures n ranks on one fresh relay group, each arena filled
// with values of its own.
func avgGroup(t *testing.T, n int, settings AveragerSettings) (*RelayGroup, []*avgRank) {
	t.Helper()
	g := NewRelayGroup(uint32(n))
	layout := avgLayout(t)
	ranks := make([]*avgRank, n)
	for r := range ranks {
		a := newArena(t, layout)
		fill(t, a.Mapping, r)
		avg := NewAverager(nil)
		if _, err := avg.Configure(context.Background(), plugin.AveragerConfig{
			Rank: uint32(r), WorldSize: uint32(n), Arena: a.Descriptor(), Relay: g.Relay(uint32(r)), Settings: settings.JSON(), RunID: "test-run",
		}); err != nil {
			t.Fatalf("rank %d Configure: %v", r, err)
		}
		t.Cleanup(func() { avg.Shutdown(context.Background()) })
		ranks[r] = &avgRank{arena: a, avg: avg}
	}
	return g, ranks
}

// fill gives every float of m a value that depends on seed, and the integer
// entry a marker.
func fill(t *testing.T, m *arena.Mapping, seed int) {
	t.Helper()
	for i, e := range m.Layout().Entries {
		if e.DType != arena.F32 {
			b, _ := m.Tensor(i)
			for k := 0; k+8 <= len(b); k += 8 {
				binary.LittleEndian.PutUint64(b[k:], uint64(1000*seed+k))
			}
			continue
		}
		v := floats(t, m, i)
		for k := range v {
			v[k] = float32(math.Sin(float64(seed*131+i*17+k)+0.3)) * float32(seed+1)
		}
	}
}

// snapshot copies every entry's bytes.
func snapshot(m *arena.Mapping) [][]byte {
	var out [][]byte
	for i := range m.Layout().Entries {
		b, _ := m.Tensor(i)
		out = append(out, slices.Clone(b))
	}
	return out
}

// roundAll runs one round on every listed rank at once.
func roundAll(ctx context.Context, ranks []*avgRank, rounds []plugin.Round) ([]plugin.RoundResult, []error) {
	res := make([]plugin.RoundResult, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { res[i], errs[i] = r.avg.Average(ctx, rounds[i]) })
	}
	wg.Wait()
	return res, errs
}

func asFloats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// contribSize is the bytes of one contribution file of avgLayout.
func contribSize(l arena.Layout) uint64 {
	n := uint64(contribHeader)
	for _, e := range l.Entries {
		if e.DType == arena.F32 {
			n += e.Bytes
		}
	}
	return n
}

func TestAverager(t *testing.T) {
	cases := []struct {
		name      string
		gamma     float64
		steps     []uint64
		broadcast bool
		root      uint32
	}{
		{name: "weighted mean", gamma: 1, steps: []uint64{1, 2, 3}},
		{name: "gamma 2", gamma: 2, steps: []uint64{1, 2, 3}},
		{name: "gamma 0 weighs ranks that trained equally", gamma: 0, steps: []uint64{4, 0, 9}},
		{name: "zero-weight rank ignored", gamma: 1, steps: []uint64{0, 5, 2}},
		{name: "all idle keep their values", gamma: 1, steps: []uint64{0, 0, 0}},
		{name: "broadcast from rank 1", gamma: 1, steps: []uint64{3, 0, 1}, broadcast: true, root: 1},
		{name: "broadcast from rank 0", gamma: 1, steps: []uint64{0, 0, 0}, broadcast: true, root: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := DefaultAveragerSettings()
			s.Gamma = c.gamma
			_, ranks := avgGroup(t, len(c.steps), s)
			layout := ranks[0].arena.Layout()
			before := make([][][]byte, len(ranks))
			weights := make([]float64, len(ranks))
			var total float64
			trained := 0
			for i, r := range ranks {
				before[i] = snapshot(r.arena.Mapping)
				if c.steps[i] > 0 {
					weights[i] = math.Pow(float64(c.steps[i]), c.gamma)
					trained++
				}
				total += weights[i]
			}
			rounds := make([]plugin.Round, len(ranks))
			for i := range rounds {
				rounds[i] = plugin.Round{Round: 0, Steps: c.steps[i], Broadcast: c.broadcast, Root: c.root}
			}
			res, errs := roundAll(context.Background(), ranks, rounds)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}

			// The reference, entry by entry, in float64 and rank order.
			want := make([][][]byte, len(ranks))
			realized := c.broadcast || total > 0
			for i := range ranks {
				want[i] = make([][]byte, len(layout.Entries))
				for e, ent := range layout.Entries {
					switch {
					case ent.DType != arena.F32 || !realized:
						want[i][e] = before[i][e]
					case c.broadcast:
						want[i][e] = before[c.root][e]
					default:
						n := len(before[i][e]) / 4
						out := make([]byte, 4*n)
						for k := range n {
							var sum float64
							for j := range ranks {
								if weights[j] == 0 {
									continue
								}
								x := float64(asFloats(before[j][e])[k])
								if ent.Role == arena.Parameter {
									sum += weights[j] * x
								} else {
									sum += x
								}
							}
							div := total
							if ent.Role == arena.Buffer {
								div = float64(trained)
							}
							binary.LittleEndian.PutUint32(out[4*k:], math.Float32bits(float32(sum/div)))
						}
						want[i][e] = out
					}
				}
			}
			for i, r := range ranks {
				got := snapshot(r.arena.Mapping)
				for e, ent := range layout.Entries {
					if !slices.Equal(got[e], want[i][e]) {
						t.Errorf("rank %d %q: got %v, want %v", i, ent.Name, asFloats(got[e])[:3], asFloats(want[i][e])[:3])
					}
				}
				first := snapshot(ranks[0].arena.Mapping)
				for e, ent := range layout.Entries {
					if realized && ent.DType == arena.F32 && !slices.Equal(got[e], first[e]) {
						t.Errorf("rank %d %q differs from rank 0's after the round", i, ent.Name)
					}
				}

				// The result's numbers, from the same snapshots.
				var pre, post, diff float64
				for e, ent := range layout.Entries {
					if ent.Role != arena.Parameter {
						continue
					}
					x, y := asFloats(before[i][e]), asFloats(got[e])
					for k := range x {
						pre += float64(x[k]) * float64(x[k])
						post += float64(y[k]) * float64(y[k])
						diff += (float64(x[k]) - float64(y[k])) * (float64(x[k]) - float64(y[k]))
					}
				}
				pre, post, diff = math.Sqrt(pre), math.Sqrt(post), math.Sqrt(diff)
				g := res[i]
				if g.Realized != realized || g.Weight != weights[i] || g.TotalWeight != total {
					t.Errorf("rank %d result %+v: want realized %v weight %v total %v", i, g, realized, weights[i], total)
				}
				if !near(g.PreNorm, pre) || !near(g.PostNorm, post) || !near(g.Divergence, diff/post) {
					t.Errorf("rank %d norms pre %v post %v divergence %v, want %v %v %v", i, g.PreNorm, g.PostNorm, g.Divergence, pre, post, diff/post)
				}
				if (g.Divergence > 0) != (realized && !(c.broadcast && uint32(i) == c.root)) {
					t.Errorf("rank %d divergence %v", i, g.Divergence)
				}
				// Its own contribution out, every peer's in, whatever
				// the weights: the relay is an all-gather.
				wantMoved := contribSize(layout) * uint64(len(ranks))
				if g.BytesMoved != wantMoved {
					t.Errorf("rank %d moved %d bytes, want %d", i, g.BytesMoved, wantMoved)
				}
				if g.TotalMS < g.WaitMS || g.TotalMS < g.ReduceMS || g.WaitMS < 0 {
					t.Errorf("rank %d timings %+v", i, g)
				}
			}
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }

func TestAveragerAbortAndNewSession(t *testing.T) {
	cases := []struct {
		name string
		// stop ends the round of ranks 0 and 1 while rank 2 never comes.
		stop    func(ranks []*avgRank, cancel context.CancelFunc)
		wantIs  error
		aborted bool // later rounds fail until NewSession
	}{
		{name: "abort", stop: func(ranks []*avgRank, _ context.CancelFunc) {
			for _, r := range ranks[:2] {
				r.avg.Abort(context.Background(), "rank 2 died")
			}
		}, wantIs: ErrAborted, aborted: true},
		{name: "context", stop: func(_ []*avgRank, cancel context.CancelFunc) { cancel() }, wantIs: context.Canceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, ranks := avgGroup(t, 3, DefaultAveragerSettings())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			var errs []error
			go func() {
				_, errs = roundAll(ctx, ranks[:2], []plugin.Round{{Round: 5, Steps: 1}, {Round: 5, Steps: 1}})
				close(done)
			}()
			select {
			case <-done:
				t.Fatalf("the round finished without rank 2: %v", errs)
			case <-time.After(100 * time.Millisecond):
			}
			stopped := time.Now()
			c.stop(ranks, cancel)
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatal("the round did not return within 2s of being stopped")
			}
			t.Logf("returned %v after the stop", time.Since(stopped))
			for i, err := range errs {
				if !errors.Is(err, c.wantIs) {
					t.Errorf("rank %d: %v, want %v", i, err, c.wantIs)
				}
			}
			if c.aborted {
				if _, err := ranks[0].avg.Average(context.Background(), plugin.Round{Round: 6, Steps: 1}); !errors.Is(err, ErrAborted) {
					t.Errorf("a round after Abort: %v, want ErrAborted", err)
				}
			}

			// Rank 2 is dead to the relay, as the coordinator makes it;
			// survivors form a new session and redo round 5. Rank 0 comes
			// first with new values: it must wait for rank 1's new post.
			g.Kill(2)
			id, err := ranks[0].avg.NewSessionID(context.Background())
			if err != nil || len(id) != 16 {
				t.Fatalf("NewSessionID = %x, %v", id, err)
			}
			for i, r := range ranks[:2] {
				if err := r.avg.NewSession(context.Background(), plugin.Session{Generation: 1, ID: id, NewRank: uint32(i), NewWorldSize: 2, Members: []uint32{0, 1}}); err != nil {
					t.Fatal(err)
				}
			}
			fill(t, ranks[0].arena.Mapping, 7)
			fill(t, ranks[1].arena.Mapping, 8)
			res := make(chan error, 1)
			go func() {
				_, err := ranks[0].avg.Average(context.Background(), plugin.Round{Round: 5, Steps: 1})
				res <- err
			}()
			select {
			case err := <-res:
				t.Fatalf("rank 0 finished the new session's round alone (%v)", err)
			case <-time.After(50 * time.Millisecond):
			}
			want := make([][]byte, 0)
			b0, b1 := snapshot(ranks[0].arena.Mapping), snapshot(ranks[1].arena.Mapping)
			for e := range b0 {
				if ranks[0].arena.Layout().Entries[e].DType != arena.F32 {
					want = append(want, nil)
					continue
				}
				x, y := asFloats(b0[e]), asFloats(b1[e])
				out := make([]byte, len(b0[e]))
				for k := range x {
					binary.LittleEndian.PutUint32(out[4*k:], math.Float32bits(float32((float64(x[k])+float64(y[k]))/2)))
				}
				want = append(want, out)
			}
			if _, err := ranks[1].avg.Average(context.Background(), plugin.Round{Round: 5, Steps: 1}); err != nil {
				t.Fatal(err)
			}
			if err := <-res; err != nil {
				t.Fatal(err)
			}
			for i, r := range ranks[:2] {
				got := snapshot(r.arena.Mapping)
				for e := range got {
					if want[e] != nil && !slices.Equal(got[e], want[e]) {
						t.Errorf("rank %d entry %d is not the two survivors' mean", i, e)
					}
				}
			}
		})
	}
}

// posted counts the posts of the exchanges in flight.
func (g *RelayGroup) posted() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, ex := range g.pending {
		n += len(ex.posted)
	}
	return n
}

func TestAveragerShutdownEndsRound(t *testing.T) {
	g, ranks := avgGroup(t, 2, DefaultAveragerSettings())
	a := ranks[0].avg
	errc := make(chan error, 1)
	go func() {
		_, err := a.Average(context.Background(), plugin.Round{Round: 0, Steps: 1})
		errc <- err
	}()
	// The round is in flight once its contribution is posted: it then
	// waits for rank 1, which never comes.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if g.posted() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 0's round never wrote its contribution")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := a.Average(context.Background(), plugin.Round{Round: 0, Steps: 1}); err == nil || !strings.Contains(err.Error(), "in flight") {
		t.Errorf("a second concurrent round: %v, want refused", err)
	}
	if err := a.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Shutdown must not return while the round still holds the averager.
	if !a.roundMu.TryLock() {
		t.Fatal("Shutdown returned before the round it ended")
	}
	a.roundMu.Unlock()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrAborted) {
			t.Errorf("round ended by Shutdown: %v, want ErrAborted", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the round ended by Shutdown never returned")
	}
	if _, err := a.Average(context.Background(), plugin.Round{Round: 1, Steps: 1}); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("a round after Shutdown: %v, want not configured", err)
	}
}

// fixedRelay answers every exchange with the caller's own blob and peer's.
type fixedRelay struct {
	rank uint32
	peer map[uint32][]byte
}

func (f fixedRelay) Exchange(_ context.Context, _ string, blob []byte) (map[uint32][]byte, error) {
	out := map[uint32][]byte{f.rank: blob}
	for r, b := range f.peer {
		out[r] = b
	}
	return out, nil
}

func TestAveragerRefusesBadContributions(t *testing.T) {
	layout := avgLayout(t)
	count := (contribSize(layout) - contribHeader) / 4
	good := func() contribution {
		return contribution{round: 0, gen: 0, session: hash64(nil), rank: 1,
			steps: 1, weight: 1, digest: layout.Digest(), count: count}
	}
	blob := func(c contribution, values uint64) []byte {
		b := make([]byte, contribHeader+4*values)
		c.encode(b)
		return b
	}
	cases := []struct {
		name    string
		bytes   []byte
		wantErr string
	}{
		{name: "empty", bytes: []byte{}, wantErr: "shorter than the"},
		{name: "short header", bytes: blob(good(), count)[:50], wantErr: "shorter than the"},
		{name: "bad magic", bytes: func() []byte { b := blob(good(), count); b[0] = 'x'; return b }(), wantErr: "magic"},
		{name: "short values", bytes: blob(good(), count)[:contribHeader+4*count-4], wantErr: "bytes, want"},
		{name: "long values", bytes: blob(good(), count+1), wantErr: "bytes, want"},
		{name: "wrong count", bytes: func() []byte { c := good(); c.count--; return blob(c, count-1) }(), wantErr: "values, the layout has"},
		{name: "huge count", bytes: func() []byte { c := good(); c.count = math.MaxUint64; return blob(c, count) }(), wantErr: "values, the layout has"},
		{name: "other layout", bytes: func() []byte { c := good(); c.digest[0] ^= 1; return blob(c, count) }(), wantErr: "different layout"},
		{name: "other rank", bytes: func() []byte { c := good(); c.rank = 2; return blob(c, count) }(), wantErr: "of rank 2"},
		{name: "other round", bytes: func() []byte { c := good(); c.round = 9; return blob(c, count) }(), wantErr: "holds round 9"},
		{name: "NaN weight", bytes: func() []byte { c := good(); c.weight = math.NaN(); return blob(c, count) }(), wantErr: "weight"},
		{name: "negative weight", bytes: func() []byte { c := good(); c.weight = -1; return blob(c, count) }(), wantErr: "weight"},
		{name: "infinite weight", bytes: func() []byte { c := good(); c.weight = math.Inf(1); return blob(c, count) }(), wantErr: "weight"},
		{name: "other generation", bytes: func() []byte { c := good(); c.gen = 5; return blob(c, count) }(), wantErr: "session generation 5"},
		{name: "other session", bytes: func() []byte { c := good(); c.session++; return blob(c, count) }(), wantErr: "session generation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newArena(t, layout)
			fill(t, a.Mapping, 0)
			avg := NewAverager(nil)
			if _, err := avg.Configure(context.Background(), plugin.AveragerConfig{
				Rank: 0, WorldSize: 2, Arena: a.Descriptor(), Relay: fixedRelay{rank: 0, peer: map[uint32][]byte{1: c.bytes}},
			}); err != nil {
				t.Fatal(err)
			}
			defer avg.Shutdown(context.Background())
			before := snapshot(a.Mapping)
			_, err := avg.Average(context.Background(), plugin.Round{Round: 0, Steps: 1})
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("Average = %v, want an error containing %q", err, c.wantErr)
			}
			if !slices.EqualFunc(before, snapshot(a.Mapping), slices.Equal) {
				t.Error("a failed round changed the arena")
			}
		})
	}
}

func TestAveragerConfigErrors(t *testing.T) {
	layout := avgLayout(t)
	a := newArena(t, layout)
	dir := t.TempDir()
	ok := plugin.AveragerConfig{Rank: 0, WorldSize: 2, Arena: a.Descriptor(), Relay: NewRelayGroup(2).Relay(0)}
	cases := []struct {
		name   string
		mutate func(*plugin.AveragerConfig)
	}{
		{name: "rank outside the world", mutate: func(c *plugin.AveragerConfig) { c.Rank = 2 }},
		{name: "empty world", mutate: func(c *plugin.AveragerConfig) { c.WorldSize = 0 }},
		{name: "no relay", mutate: func(c *plugin.AveragerConfig) { c.Relay = nil }},
		{name: "unknown setting", mutate: func(c *plugin.AveragerConfig) { c.Settings = []byte(`{"gama": 1}`) }},
		{name: "negative gamma", mutate: func(c *plugin.AveragerConfig) { c.Settings = []byte(`{"gamma": -1}`) }},
		{name: "removed poll setting", mutate: func(c *plugin.AveragerConfig) { c.Settings = []byte(`{"poll": "2ms"}`) }},
		{name: "missing arena", mutate: func(c *plugin.AveragerConfig) { c.Arena.Path = filepath.Join(dir, "none") }},
		{name: "arena smaller than its layout", mutate: func(c *plugin.AveragerConfig) { c.Arena.Layout.Size *= 4 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.mutate(&cfg)
			if _, err := NewAverager(nil).Configure(context.Background(), cfg); err == nil {
				t.Fatalf("Configure(%+v) succeeded", cfg)
			}
		})
	}

	avg := NewAverager(nil)
	if err := avg.NewSession(context.Background(), plugin.Session{NewWorldSize: 1, Members: []uint32{0}}); err == nil {
		t.Error("NewSession before Configure succeeded")
	}
	if _, err := avg.Configure(context.Background(), ok); err != nil {
		t.Fatal(err)
	}
	defer avg.Shutdown(context.Background())
	sessions := []struct {
		name string
		s    plugin.Session
	}{
		{name: "world size disagrees", s: plugin.Session{NewRank: 0, NewWorldSize: 3, Members: []uint32{0, 1}}},
		{name: "new rank outside", s: plugin.Session{NewRank: 2, NewWorldSize: 2, Members: []uint32{0, 1}}},
		{name: "repeated member", s: plugin.Session{NewRank: 0, NewWorldSize: 2, Members: []uint32{0, 0}}},
		{name: "not this rank", s: plugin.Session{NewRank: 1, NewWorldSize: 2, Members: []uint32{0, 1}}},
		{name: "empty", s: plugin.Session{}},
	}
	for _, c := range sessions {
		if err := avg.NewSession(context.Background(), c.s); err == nil {
			t.Errorf("NewSession %s (%+v) succeeded", c.name, c.s)
		}
	}
	if _, err := avg.Average(context.Background(), plugin.Round{Broadcast: true, Root: 2}); err == nil {
		t.Error("a broadcast from a root outside the session succeeded")
	}
}

// TestTrainersAverageInProcess trains three in-process trainers on their
// parts of an epoch, averages through their arenas and adopts.
func TestTrainersAverageInProcess(t *testing.T) {
	const seed, world = 21, 3
	ctx := context.Background()
	g := NewRelayGroup(world)
	trainers := make([]*Trainer, world)
	arenas := make([]*arena.Owned, world)
	avgs := make([]*avgRank, world)
	var samples uint64
	for r := range world {
		tr, setup := configure(t, uint32(r), world, seed, small())
		trainers[r], arenas[r], samples = tr, attach(t, tr, setup), setup.Samples
		avg := NewAverager(nil)
		if _, err := avg.Configure(ctx, plugin.AveragerConfig{Rank: uint32(r), WorldSize: world, Arena: arenas[r].Descriptor(), Relay: g.Relay(uint32(r))}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { avg.Shutdown(ctx) })
		avgs[r] = &avgRank{arena: arenas[r], avg: avg}
	}
	rounds := make([]plugin.Round, world)
	for r, tr := range trainers {
		part := samples / world
		train(t, tr, plugin.Plan{Seed: seed, PickSpace: samples, PartitionOffset: uint64(r) * part, PartitionSize: part})
		pub, err := tr.Publish(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rounds[r] = plugin.Round{Round: 0, Steps: pub.Steps}
	}
	w0, _, _, _ := trainers[0].Snapshot()
	for _, tr := range trainers[1:] {
		if w, _, _, _ := tr.Snapshot(); bitsEqual(w, w0) {
			t.Fatal("ranks trained on different data hold the same weights")
		}
	}
	_, errs := roundAll(ctx, avgs, rounds)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, tr := range trainers {
		if _, err := tr.Adopt(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	w0, b0, _, _ := trainers[0].Snapshot()
	for r, tr := range trainers[1:] {
		w, b, _, _ := tr.Snapshot()
		if !bitsEqual(w, w0) || !bitsEqual(b, b0) || !bitsEqual(tr.FeatureMean(), trainers[0].FeatureMean()) {
			t.Errorf("rank %d differs from rank 0 after averaging", r+1)
		}
	}
}
