package conformance

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// grace is how long the suite waits for a call to return once it has
// cancelled its context, before it gives up on it.
const grace = 5 * time.Second

// testRunID names the suite's runs when no meeting point names them.
const testRunID = "conformance"

// avgLayout holds parameters of awkward sizes, an f32 buffer (averaged
// among the ranks that trained) and an i64 buffer (which stays local).
func avgLayout() (arena.Layout, error) {
	return arena.Pack([]arena.Entry{
		{Name: "w", DType: arena.F32, Shape: []int64{37, 13}, Role: arena.Parameter},
		{Name: "stats", DType: arena.F32, Shape: []int64{29}, Role: arena.Buffer},
		{Name: "count", DType: arena.I64, Shape: []int64{3}, Role: arena.Buffer},
		{Name: "b", DType: arena.F32, Shape: []int64{1001}, Role: arena.Parameter},
	})
}

// rank is one member of a cohort: its averager and its arena.
type rank struct {
	avg    plugin.Averager
	arena  *arena.Owned
	traits plugin.AveragerTraits
	down   bool // shut down by the check
}

// cohort is a world of ranks configured on one relay (and meeting point).
type cohort struct {
	t      T
	layout arena.Layout
	relay  *plugintest.RelayGroup
	meet   Meeting
	ranks  []*rank
}

// newCohort makes world fresh averagers, each on its own arena filled with
// values of its own, and configures them all at once with settings.
func (s *avgSuite) newCohort(t T, world uint32, settings json.RawMessage) *cohort {
	t.Helper()
	layout, err := avgLayout()
	if err != nil {
		t.Fatalf("conformance suite: layout: %v", err)
	}
	c := &cohort{t: t, layout: layout, relay: plugintest.NewRelayGroup(world), meet: Meeting{RunID: testRunID}}
	dir := t.TempDir()
	c.ranks = make([]*rank, world)
	for r := range c.ranks {
		a, err := arena.Create(dir, fmt.Sprintf("conformance-r%d", r), layout)
		if err != nil {
			t.Fatalf("conformance suite: %v", err)
		}
		t.Cleanup(func() { a.Remove() })
		avg, err := s.f(t)
		if err != nil {
			t.Fatalf("the factory could not make an averager: %v", err)
		}
		c.ranks[r] = &rank{avg: avg, arena: a}
	}
	t.Cleanup(c.shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), CallBound)
	d, err := c.ranks[0].avg.Describe(ctx)
	cancel()
	if err != nil {
		t.Fatalf("Describe must succeed before Configure: %v", err)
	}
	if d.MeetingKind() == plugin.MeetReduceServer {
		if s.o.meet == nil {
			t.Fatalf("Describe says Meeting %q: pass conformance.MeetingPoint so the suite has a reduce server for each cohort", d.Meeting)
		}
		c.meet = s.o.meet(t, world, layout)
	}
	c.fill(1)
	errs := make([]error, world)
	c.each(all(c), func(ctx context.Context, r int) {
		cfg := plugin.AveragerConfig{Rank: uint32(r), WorldSize: world, Arena: c.ranks[r].arena.Descriptor(),
			Endpoint: c.meet.Endpoint, DataKey: c.meet.DataKey, Settings: settings, RunID: c.meet.RunID, Relay: c.relay.Relay(uint32(r))}
		c.ranks[r].traits, errs[r] = c.ranks[r].avg.Configure(ctx, cfg)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Configure must accept rank %d of a world of %d with settings %s: %v", r, world, settings, err)
		}
	}
	return c
}

func all(c *cohort) []int {
	idx := make([]int, len(c.ranks))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// each runs f for the listed ranks at once, each with a context ending at
// CallBound, and returns when every one has; one that outlives its
// context by grace fails the check.
func (c *cohort) each(idx []int, f func(ctx context.Context, r int)) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallBound)
	defer cancel()
	var wg sync.WaitGroup
	for _, r := range idx {
		wg.Go(func() { f(ctx, r) })
	}
	if !waitFor(&wg, CallBound+grace) {
		c.t.Fatalf("a call did not return within %v, nor %v after its context ended; it is left running", CallBound, grace)
	}
}

// waitFor waits for wg up to d.
func waitFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// shutdown shuts down every rank still up, at once.
func (c *cohort) shutdown() {
	var up []int
	for r, rk := range c.ranks {
		if !rk.down {
			up = append(up, r)
		}
	}
	c.each(up, func(ctx context.Context, r int) { c.ranks[r].avg.Shutdown(ctx) })
}

// rounds runs rounds[i] on rank idx[i], all at once.
func (c *cohort) rounds(idx []int, rounds []plugin.Round) ([]plugin.RoundResult, []error) {
	c.t.Helper()
	res := make([]plugin.RoundResult, len(idx))
	errs := make([]error, len(idx))
	pos := map[int]int{}
	for i, r := range idx {
		pos[r] = i
	}
	c.each(idx, func(ctx context.Context, r int) {
		i := pos[r]
		res[i], errs[i] = c.ranks[r].avg.Average(ctx, rounds[i])
	})
	return res, errs
}

// average runs round n on the listed ranks with steps[i] for idx[i] and
// fails the check on any error.
func (c *cohort) average(idx []int, n uint64, steps []uint64) []plugin.RoundResult {
	c.t.Helper()
	rounds := make([]plugin.Round, len(idx))
	for i := range rounds {
		rounds[i] = plugin.Round{Round: n, Steps: steps[i]}
	}
	res, errs := c.rounds(idx, rounds)
	for i, err := range errs {
		if err != nil {
			c.t.Fatalf("round %d with steps %v: rank %d: Average failed: %v", n, steps, idx[i], err)
		}
	}
	return res
}

// fill gives every f32 value of every rank a value of its own, drawn from
// seed, and the i64 buffer a marker.
func (c *cohort) fill(seed int) {
	for r := range c.ranks {
		c.fillRank(r, seed)
	}
}

func (c *cohort) fillRank(r, seed int) {
	m := c.ranks[r].arena
	for i, e := range c.layout.Entries {
		b, _ := m.Tensor(i)
		if e.DType != arena.F32 {
			for k := range b {
				b[k] = byte(seed*31 + r*7 + k)
			}
			continue
		}
		v := arena.AsFloat32s(b)
		for k := range v {
			v[k] = float32(math.Sin(float64(seed*7919+r*131+i*17+k)+0.3)) * float32(r+seed)
		}
	}
}

// snapshot is every rank's entries' bytes.
type snapshot [][][]byte

func (c *cohort) snapshot() snapshot {
	s := make(snapshot, len(c.ranks))
	for r, rk := range c.ranks {
		for i := range c.layout.Entries {
			b, _ := rk.arena.Tensor(i)
			s[r] = append(s[r], bytes.Clone(b))
		}
	}
	return s
}

// restore writes s back into every arena.
func (c *cohort) restore(s snapshot) {
	for r, rk := range c.ranks {
		for i := range c.layout.Entries {
			b, _ := rk.arena.Tensor(i)
			copy(b, s[r][i])
		}
	}
}

func f32(b []byte, k int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:])) }

// checkMean holds the listed ranks' f32 entries to the weighted mean of
// pre's values of the ranks in from, weighted by w: parameters by w,
// buffers equally among the ranks of w above 0.
func (c *cohort) checkMean(promise string, idx, from []int, pre snapshot, w []float64) bool {
	c.t.Helper()
	for i, e := range c.layout.Entries {
		if e.DType != arena.F32 {
			continue
		}
		for k := 0; k < int(e.Bytes/4); k++ {
			var sum, mag, total float64
			for j, r := range from {
				wj := w[j]
				if e.Role == arena.Buffer && wj > 0 {
					wj = 1
				}
				x := float64(f32(pre[r][i], k))
				sum, mag, total = sum+wj*x, mag+wj*math.Abs(x), total+wj
			}
			want, tol := sum/total, Tolerance*mag/total
			for _, r := range idx {
				b, _ := c.ranks[r].arena.Tensor(i)
				if got := float64(f32(b, k)); !(math.Abs(got-want) <= tol) {
					c.t.Errorf("%s: rank %d, %v %q[%d]: got %v, want %v ± %.3g (weights %v of ranks %v)",
						promise, r, e.Role, e.Name, k, got, want, tol, w, from)
					return false
				}
			}
		}
	}
	return true
}

// checkIdentical: after a round every listed rank holds the same f32
// values, bit for bit.
func (c *cohort) checkIdentical(idx []int) bool {
	c.t.Helper()
	for i, e := range c.layout.Entries {
		if e.DType != arena.F32 {
			continue
		}
		first, _ := c.ranks[idx[0]].arena.Tensor(i)
		for _, r := range idx[1:] {
			b, _ := c.ranks[r].arena.Tensor(i)
			if k := diffAt(first, b); k >= 0 {
				c.t.Errorf("every rank must hold bit-identical values after a round: %q[%d] is %v on rank %d but %v on rank %d",
					e.Name, k, f32(first, k), idx[0], f32(b, k), r)
				return false
			}
		}
	}
	return true
}

// checkUnchanged: the listed ranks' entries (f32 ones too when floats) are
// bit for bit as in pre.
func (c *cohort) checkUnchanged(promise string, idx []int, pre snapshot, floats bool) bool {
	c.t.Helper()
	for i, e := range c.layout.Entries {
		if e.DType == arena.F32 && !floats {
			continue
		}
		for _, r := range idx {
			b, _ := c.ranks[r].arena.Tensor(i)
			if k := diffAt(pre[r][i], b); k >= 0 {
				c.t.Errorf("%s: rank %d, %v %v entry %q changed (first at 4-byte word %d)", promise, r, e.DType, e.Role, e.Name, k)
				return false
			}
		}
	}
	return true
}

// diffAt is the first f32 index (or byte index, for other data) where a
// and b differ, -1 when they are equal.
func diffAt(a, b []byte) int {
	for k := 0; k+4 <= len(a); k += 4 {
		if !bytes.Equal(a[k:k+4], b[k:k+4]) {
			return k / 4
		}
	}
	if !bytes.Equal(a, b) {
		return len(a) / 4
	}
	return -1
}
