package trimmedmean

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// The layout of every test: an f32 parameter, an f64 buffer (averaged too)
// and an i64 buffer (a step counter: stays local).
var testEntries = []arena.Entry{
	{Name: "w", DType: arena.F32, Shape: []int64{2, 3}, Role: arena.Parameter},
	{Name: "count", DType: arena.I64, Shape: []int64{1}, Role: arena.Buffer},
	{Name: "stats", DType: arena.F64, Shape: []int64{2}, Role: arena.Buffer},
}

type rank struct {
	avg   *Averager
	arena *arena.Owned
}

// group configures world averagers, each on its own arena, meeting through
// one in-process relay, as the ranks of a run meet through the
// coordinator's.
func group(t *testing.T, world int, settings string, maxChunk int) (*plugintest.RelayGroup, []*rank) {
	t.Helper()
	layout, err := arena.Pack(testEntries)
	if err != nil {
		t.Fatal(err)
	}
	g := plugintest.NewRelayGroup(uint32(world))
	ranks := make([]*rank, world)
	for r := range ranks {
		a, err := arena.Create(t.TempDir(), fmt.Sprintf("trimmedmean-test-r%d", r), layout)
		if err != nil {
			t.Fatal(err)
		}
		avg := New(nil)
		avg.maxChunk = maxChunk
		traits, err := avg.Configure(context.Background(), plugin.AveragerConfig{
			Rank: uint32(r), WorldSize: uint32(world), Arena: a.Descriptor(),
			Settings: []byte(settings), Relay: g.Relay(uint32(r)),
		})
		if err != nil {
			t.Fatal(err)
		}
		if !traits.SoloIdentity {
			t.Error("SoloIdentity is false; a lone rank's trimmed mean is its own values")
		}
		ranks[r] = &rank{avg: avg, arena: a}
		t.Cleanup(func() {
			avg.Shutdown(context.Background())
			a.Remove()
		})
	}
	return g, ranks
}

// roundAll runs rounds[i] on ranks[i], concurrently, as the ranks of a
// cohort do.
func roundAll(ranks []*rank, rounds []plugin.Round) ([]plugin.RoundResult, []error) {
	res := make([]plugin.RoundResult, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { res[i], errs[i] = r.avg.Average(context.Background(), rounds[i]) })
	}
	wg.Wait()
	return res, errs
}

func tensor(t *testing.T, m *arena.Mapping, name string) []byte {
	t.Helper()
	b, err := m.Tensor(m.Layout().Index(name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// set writes a rank's values: w (f32), count (i64) and stats (f64).
func set(t *testing.T, m *arena.Mapping, w []float32, count int64, stats []float64) {
	t.Helper()
	wb := tensor(t, m, "w")
	for j, v := range w {
		binary.LittleEndian.PutUint32(wb[4*j:], math.Float32bits(v))
	}
	binary.LittleEndian.PutUint64(tensor(t, m, "count"), uint64(count))
	sb := tensor(t, m, "stats")
	for j, v := range stats {
		binary.LittleEndian.PutUint64(sb[8*j:], math.Float64bits(v))
	}
}

func get(t *testing.T, m *arena.Mapping) (w []float32, count int64, stats []float64) {
	t.Helper()
	wb := tensor(t, m, "w")
	for j := 0; j < len(wb); j += 4 {
		w = append(w, math.Float32frombits(binary.LittleEndian.Uint32(wb[j:])))
	}
	count = int64(binary.LittleEndian.Uint64(tensor(t, m, "count")))
	sb := tensor(t, m, "stats")
	for j := 0; j < len(sb); j += 8 {
		stats = append(stats, math.Float64frombits(binary.LittleEndian.Uint64(sb[j:])))
	}
	return w, count, stats
}

func TestTrimmedMean(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		col  []float64
		trim int
		want float64
	}{
		{[]float64{4, 1, 3, 2}, 0, 2.5},
		{[]float64{4, 1, 1e30, 3, 2}, 1, 3},                // the high outlier and the lowest honest value go
		{[]float64{4, 1, nan, 3, 2}, 1, 2},                 // NaN sorts low and is trimmed
		{[]float64{4, -inf, inf, 3, 2, 5, 1}, 2, 3},        // two outliers, one each side
		{[]float64{7}, 3, 7},                               // one value: nothing to trim
		{[]float64{1, 2, 10, 20}, 5, 6},                    // trim shrinks to 1: the middle two
		{[]float64{1, 2, 4}, 1, 2},                         // three values, trim 1: the median
		{[]float64{-1e300, -1e300, 1, 1e300, 1e300}, 2, 1}, // two bad ranks survive trim 2
	}
	for _, c := range cases {
		in := fmt.Sprint(c.col)
		if got := TrimmedMean(c.col, c.trim); got != c.want {
			t.Errorf("TrimmedMean(%s, %d) = %v, want %v", in, c.trim, got, c.want)
		}
	}
}

// Five ranks, one holding garbage (huge, NaN, ±Inf): with trim 1 every
// coordinate is the mean of the middle three values, so the garbage moves
// nothing, and every rank ends with the same bytes. Steps differ to show
// they do not weigh the values. Split over 7-byte blobs (elements cut
// across exchanges) the answer is the same.
func TestRoundIgnoresABadRank(t *testing.T) {
	for _, maxChunk := range []int{0, 7} {
		t.Run(fmt.Sprintf("chunk=%d", maxChunk), func(t *testing.T) {
			_, ranks := group(t, 5, `{"trim": 1}`, maxChunk)
			for r := range 4 {
				// Honest rank r holds (r+1) + 10j at coordinate j.
				w := make([]float32, 6)
				for j := range w {
					w[j] = float32(r+1) + 10*float32(j)
				}
				set(t, ranks[r].arena.Mapping, w, int64(100*r), []float64{0.5 * float64(r), -float64(r)})
			}
			inf := float32(math.Inf(1))
			set(t, ranks[4].arena.Mapping,
				[]float32{1e30, -1e30, float32(math.NaN()), inf, -inf, 3e38}, 400, []float64{1e300, math.NaN()})
			steps := []uint64{1, 7, 3, 2, 5}
			rounds := make([]plugin.Round, 5)
			for i := range rounds {
				rounds[i] = plugin.Round{Round: 3, Steps: steps[i]}
			}
			res, errs := roundAll(ranks, rounds)

			// A high outlier drops the honest 1, a low one the honest 4.
			wantW := []float32{3, 12, 22, 33, 42, 53}
			wantStats := []float64{1, -2}
			var first []byte
			for r, rk := range ranks {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				w, count, stats := get(t, rk.arena.Mapping)
				if fmt.Sprint(w) != fmt.Sprint(wantW) || fmt.Sprint(stats) != fmt.Sprint(wantStats) {
					t.Errorf("rank %d: w %v stats %v, want %v %v", r, w, stats, wantW, wantStats)
				}
				if count != int64(100*r) {
					t.Errorf("rank %d: the i64 tensor became %d; integer tensors stay local", r, count)
				}
				if b := tensor(t, rk.arena.Mapping, "w"); first == nil {
					first = bytes.Clone(b)
				} else if !bytes.Equal(b, first) {
					t.Errorf("rank %d's parameters differ from rank 0's bit for bit", r)
				}
				if got := res[r]; !got.Realized || got.Weight != float64(steps[r]) || got.TotalWeight != 18 ||
					got.BytesMoved == 0 || math.IsNaN(got.PostNorm) || got.PostNorm == 0 {
					t.Errorf("rank %d: result %+v", r, got)
				}
			}
		})
	}
}

// A rank that trained no steps takes no part: with trim 0 (the plain mean)
// its garbage still moves nothing, and it receives the others' mean. When
// nobody trained, every arena keeps its values.
func TestIdleRanksTakeNoPart(t *testing.T) {
	_, ranks := group(t, 3, `{"trim": 0}`, 0)
	set(t, ranks[0].arena.Mapping, []float32{1, 2, 3, 4, 5, 6}, 0, []float64{1, 10})
	set(t, ranks[1].arena.Mapping, []float32{3, 4, 5, 6, 7, 8}, 0, []float64{3, 30})
	set(t, ranks[2].arena.Mapping, []float32{1e30, 1e30, 1e30, 1e30, 1e30, 1e30}, 0, []float64{1e300, 1e300})

	idle := []plugin.Round{{Round: 1}, {Round: 1}, {Round: 1}}
	res, errs := roundAll(ranks, idle)
	for r := range ranks {
		if errs[r] != nil || res[r].Realized || res[r].TotalWeight != 0 {
			t.Fatalf("nobody trained, rank %d: %+v, %v; want an unrealized round", r, res[r], errs[r])
		}
	}
	if w, _, _ := get(t, ranks[2].arena.Mapping); w[0] != 1e30 {
		t.Fatalf("an unrealized round changed rank 2's values to %v", w)
	}

	res, errs = roundAll(ranks, []plugin.Round{{Round: 2, Steps: 4}, {Round: 2, Steps: 4}, {Round: 2}})
	for r, rk := range ranks {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		w, _, stats := get(t, rk.arena.Mapping)
		if fmt.Sprint(w) != "[2 3 4 5 6 7]" || fmt.Sprint(stats) != "[2 20]" {
			t.Errorf("rank %d: w %v stats %v, want the mean of ranks 0 and 1", r, w, stats)
		}
		if !res[r].Realized || res[r].TotalWeight != 8 {
			t.Errorf("rank %d: %+v", r, res[r])
		}
	}
}

// A broadcast names its root by position in the current session: after
// rank 1 dies and the survivors re-form as members [0 2], root 1 is global
// rank 2, whose values both survivors end with.
func TestBroadcastCopiesTheSessionRoot(t *testing.T) {
	g, ranks := group(t, 3, "", 0)
	for r, rk := range ranks {
		f := float32(r + 1)
		set(t, rk.arena.Mapping, []float32{f, f, f, f, f, f}, int64(r), []float64{float64(f), -float64(f)})
	}
	g.Kill(1)
	survivors := []*rank{ranks[0], ranks[2]}
	for i, rk := range survivors {
		if err := rk.avg.NewSession(context.Background(), plugin.Session{Generation: 1, NewRank: uint32(i), NewWorldSize: 2, Members: []uint32{0, 2}}); err != nil {
			t.Fatal(err)
		}
	}
	bc := plugin.Round{Round: 4, Broadcast: true, Root: 1}
	res, errs := roundAll(survivors, []plugin.Round{bc, bc})
	for i, rk := range survivors {
		if errs[i] != nil {
			t.Fatalf("survivor %d: %v", i, errs[i])
		}
		w, count, stats := get(t, rk.arena.Mapping)
		if fmt.Sprint(w) != "[3 3 3 3 3 3]" || fmt.Sprint(stats) != "[3 -3]" {
			t.Errorf("survivor %d: w %v stats %v, want global rank 2's values", i, w, stats)
		}
		if want := []int64{0, 2}[i]; count != want {
			t.Errorf("survivor %d: the i64 tensor became %d, want its own %d", i, count, want)
		}
		if !res[i].Realized {
			t.Errorf("survivor %d: broadcast not realized: %+v", i, res[i])
		}
	}
}

// signalRelay tells the test when its rank has called Exchange.
type signalRelay struct {
	plugin.Relay
	called chan<- struct{}
}

func (s signalRelay) Exchange(ctx context.Context, key string, blob []byte) (map[uint32][]byte, error) {
	s.called <- struct{}{}
	return s.Relay.Exchange(ctx, key, blob)
}

// A peer dying mid-round fails the round for the others as aborted (so
// the core re-forms the group rather than ending the rank), and the
// survivors' next session averages among them alone.
func TestPeerDeathAbortsTheRound(t *testing.T) {
	g, ranks := group(t, 3, `{"trim": 1}`, 0)
	called := make(chan struct{}, 2)
	for _, rk := range ranks[:2] {
		rk.avg.relay = signalRelay{Relay: rk.avg.relay, called: called}
	}
	set(t, ranks[0].arena.Mapping, []float32{1, 1, 1, 1, 1, 1}, 0, []float64{1, 1})
	set(t, ranks[1].arena.Mapping, []float32{3, 3, 3, 3, 3, 3}, 0, []float64{3, 3})
	done := make(chan []error)
	go func() {
		_, errs := roundAll(ranks[:2], []plugin.Round{{Round: 1, Steps: 1}, {Round: 1, Steps: 1}})
		done <- errs
	}()
	<-called
	<-called
	// Give both posts time to land in the relay before the death, as they
	// would have while the coordinator noticed it.
	time.Sleep(100 * time.Millisecond)
	g.Kill(2)
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the round did not end within 5s of the peer's death")
	}
	for i, err := range errs {
		if !errors.Is(err, plugin.ErrRoundAborted) {
			t.Errorf("rank %d: %v, want an error wrapping plugin.ErrRoundAborted", i, err)
		}
	}
	if w, _, _ := get(t, ranks[0].arena.Mapping); w[0] != 1 {
		t.Errorf("an aborted round changed rank 0's values to %v", w)
	}

	for i, rk := range ranks[:2] {
		if err := rk.avg.NewSession(context.Background(), plugin.Session{Generation: 1, NewRank: uint32(i), NewWorldSize: 2, Members: []uint32{0, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		_, errs := roundAll(ranks[:2], []plugin.Round{{Round: 2, Steps: 1}, {Round: 2, Steps: 1}})
		done <- errs
	}()
	for range 2 {
		<-called
	}
	for i, err := range <-done {
		if err != nil {
			t.Fatalf("rank %d in the new session: %v", i, err)
		}
		// Two ranks, trim 1: the trim shrinks to 0, the plain mean.
		if w, _, _ := get(t, ranks[i].arena.Mapping); w[0] != 2 {
			t.Errorf("rank %d after the survivors' round: %v, want their mean 2", i, w)
		}
	}
}

// After Abort every round fails at once, as aborted, without waiting for
// peers, until a NewSession lifts it.
func TestAbortHoldsUntilNewSession(t *testing.T) {
	_, ranks := group(t, 2, "", 0)
	if err := ranks[0].avg.Abort(context.Background(), "watchdog"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := ranks[0].avg.Average(context.Background(), plugin.Round{Round: 1, Steps: 1})
	if !errors.Is(err, plugin.ErrRoundAborted) || !strings.Contains(err.Error(), "watchdog") {
		t.Errorf("a round after Abort: %v, want ErrRoundAborted naming the reason", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the aborted round took %v to fail", d)
	}
	for i, rk := range ranks {
		if err := rk.avg.NewSession(context.Background(), plugin.Session{Generation: 1, NewRank: uint32(i), NewWorldSize: 2, Members: []uint32{0, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	_, errs := roundAll(ranks, []plugin.Round{{Round: 2, Steps: 1}, {Round: 2, Steps: 1}})
	for i, err := range errs {
		if err != nil {
			t.Errorf("rank %d after NewSession: %v", i, err)
		}
	}
}

func TestSettings(t *testing.T) {
	cases := []struct {
		raw     string
		want    int
		wantErr string
	}{
		{raw: "", want: 1},
		{raw: "{}", want: 1},
		{raw: `{"trim": 3}`, want: 3},
		{raw: `{"trim": 0}`, want: 0},
		{raw: `{"trim": -1}`, wantErr: "must be 0 or more"},
		{raw: `{"trimm": 2}`, wantErr: `unknown key "trimm"`},
		{raw: `{"trim": "2"}`, wantErr: `key "trim"`},
		{raw: `{"trim": 1.5}`, wantErr: `key "trim"`},
	}
	for _, c := range cases {
		s, err := ParseSettings([]byte(c.raw))
		switch {
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("ParseSettings(%s) = %+v, %v; want an error containing %q", c.raw, s, err, c.wantErr)
		case c.wantErr == "" && (err != nil || s.Trim != c.want):
			t.Errorf("ParseSettings(%s) = %+v, %v; want trim %d", c.raw, s, err, c.want)
		}
	}
}

// The core picks the meeting point by Description.Meeting; this averager
// needs the relay and nothing else.
func TestDescribe(t *testing.T) {
	d, err := New(nil).Describe(context.Background())
	if err != nil || d.Name != Name || d.MeetingKind() != plugin.MeetRelay || d.Version == "" {
		t.Errorf("Describe = %+v, %v", d, err)
	}
}

// A half-precision tensor is refused at Configure: left unaveraged, the
// ranks would drift apart unnoticed.
func TestConfigureRefusesHalfPrecision(t *testing.T) {
	layout, err := arena.Pack([]arena.Entry{{Name: "h", DType: arena.BF16, Shape: []int64{4}, Role: arena.Parameter}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := arena.Create(t.TempDir(), "trimmedmean-test", layout)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Remove()
	_, err = New(nil).Configure(context.Background(), plugin.AveragerConfig{
		WorldSize: 1, Arena: a.Descriptor(), Relay: plugintest.NewRelayGroup(1).Relay(0)})
	if err == nil || !strings.Contains(err.Error(), `"h" is bf16`) {
		t.Errorf("Configure with a bf16 tensor: %v", err)
	}
}
