package averager

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/cudalib"
	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// bound is how long any call of these tests may take: a bug fails the
// test instead of hanging it.
const bound = 5 * time.Second

// group is a world of averagers on one fake fabric and relay.
type group struct {
	t      *testing.T
	fabric *backend.Fabric
	relay  *plugintest.RelayGroup
	bes    []*backend.Fake
	avgs   []*Averager
	arenas []*arena.Owned
	// blocks, in a device group, are the trainers' parameters on the
	// device (f32 entries packed, arena.DeviceBlock), allocated by a
	// backend of their own on each rank's host: the averagers map them.
	blocks []backend.Memory
	gpus   []string
}

func testLayout(t *testing.T) arena.Layout {
	l, err := arena.Pack([]arena.Entry{
		{Name: "w", DType: arena.F32, Shape: []int64{5, 7}, Role: arena.Parameter},
		{Name: "running_mean", DType: arena.F32, Shape: []int64{3}, Role: arena.Buffer},
		{Name: "steps", DType: arena.I64, Shape: []int64{1}, Role: arena.Buffer},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newGroup configures world averagers with settings, each arena filled
// with values of its own, every rank on a host and GPU of its own.
func newGroup(t *testing.T, world int, settings string) *group {
	return newGroupOn(t, world, settings, 1, func(r int) string { return fmt.Sprintf("h%d", r) })
}

// newGroupOn is newGroup with rank r on host(r), whose devices GPUs the
// ranks there take in turn (the averager's default: rank modulo devices).
func newGroupOn(t *testing.T, world int, settings string, devices int, host func(r int) string) *group {
	t.Helper()
	return newGroupWith(t, world, settings, devices, host, false)
}

// newDeviceGroup is newGroupOn with every trainer's parameters on its GPU,
// handed to the averager as a device block.
func newDeviceGroup(t *testing.T, world int, settings string, devices int, host func(r int) string) *group {
	t.Helper()
	return newGroupWith(t, world, settings, devices, host, true)
}

func newGroupWith(t *testing.T, world int, settings string, devices int, host func(r int) string, device bool) *group {
	t.Helper()
	g := &group{t: t, fabric: backend.NewFabric(devices), relay: plugintest.NewRelayGroup(uint32(world))}
	layout, dir := testLayout(t), t.TempDir()
	for r := range world {
		be := g.fabric.BackendOn(host(r))
		a := New(nil, func(cudalib.Options) (backend.Backend, error) { return be, nil })
		ar, err := arena.Create(dir, fmt.Sprintf("nccl-test-r%d", r), layout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ar.Remove() })
		v, _ := ar.Float32s(0)
		for k := range v {
			v[k] = float32(math.Sin(float64(r*100+k))) * float32(r+1)
		}
		b, _ := ar.Float32s(1)
		for k := range b {
			b[k] = float32(r*10 + k)
		}
		g.bes, g.avgs, g.arenas = append(g.bes, be), append(g.avgs, a), append(g.arenas, ar)
		if device {
			// The trainer, a process of its own on the rank's host and
			// GPU, holds the parameters; the arena's copies go stale.
			tr := g.fabric.BackendOn(host(r))
			dev := r % devices
			m, err := tr.Alloc(dev, int(layout.DeviceBytes()))
			if err != nil {
				t.Fatal(err)
			}
			id, _ := tr.DeviceID(dev)
			g.blocks, g.gpus = append(g.blocks, m), append(g.gpus, id)
			g.setValues(r, 0, v)
			g.setValues(r, 1, b)
			clear(v)
			clear(b)
		}
	}
	t.Cleanup(func() {
		g.each(g.all(), func(ctx context.Context, r int) error { return g.avgs[r].Shutdown(ctx) })
		for _, m := range g.blocks {
			m.Close() // the trainers'
		}
		if n := g.fabric.Live(); n != 0 {
			t.Errorf("%d communicators outlived Shutdown", n)
		}
		if n := g.fabric.Allocated(); n != 0 {
			t.Errorf("%d device allocations outlived Shutdown", n)
		}
	})
	errs := g.each(g.all(), func(ctx context.Context, r int) error {
		_, err := g.avgs[r].Configure(ctx, plugin.AveragerConfig{Rank: uint32(r), WorldSize: uint32(world),
			Arena: g.desc(r), Settings: []byte(settings), Relay: g.relay.Relay(uint32(r))})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Configure rank %d: %v", r, err)
		}
	}
	return g
}

// desc is rank r's arena descriptor, with its trainer's block in a device
// group.
func (g *group) desc(r int) arena.Descriptor {
	d := g.arenas[r].Descriptor()
	if g.blocks != nil {
		h, err := g.blocks[r].Handle()
		if err != nil {
			g.t.Fatal(err)
		}
		d.Device = &arena.DeviceBlock{GPU: g.gpus[r], Handle: h, Size: d.Layout.DeviceBytes()}
	}
	return d
}

// span is where f32 entry k lies among the device block's elements.
func (g *group) span(r, entry int) (off, n int) {
	for k, e := range g.arenas[r].Descriptor().Layout.Entries {
		if e.DType != arena.F32 {
			continue
		}
		if k == entry {
			return off, int(e.Bytes / 4)
		}
		off += int(e.Bytes / 4)
	}
	g.t.Fatalf("no f32 entry %d", entry)
	return 0, 0
}

// setValues writes rank r's f32 entry where its parameters live.
func (g *group) setValues(r, entry int, vals []float32) {
	if g.blocks == nil {
		v, _ := g.arenas[r].Float32s(entry)
		copy(v, vals)
		return
	}
	all := g.block(r)
	off, n := g.span(r, entry)
	copy(all[off:off+n], vals)
	if err := g.blocks[r].Write(f32bytes(all)); err != nil {
		g.t.Fatal(err)
	}
}

func (g *group) block(r int) []float32 {
	b := make([]byte, g.blocks[r].Len())
	if err := g.blocks[r].Read(b); err != nil {
		g.t.Fatal(err)
	}
	return append([]float32(nil), arena.AsFloat32s(b)...)
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func (g *group) all() []int {
	idx := make([]int, len(g.avgs))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// each runs f on the listed ranks at once and fails the test when one
// outlives bound.
func (g *group) each(idx []int, f func(ctx context.Context, r int) error) map[int]error {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var mu sync.Mutex
	errs := map[int]error{}
	var wg sync.WaitGroup
	for _, r := range idx {
		wg.Go(func() {
			err := f(ctx, r)
			mu.Lock()
			errs[r] = err
			mu.Unlock()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound + time.Second):
		g.t.Fatalf("a call did not return within %v", bound)
	}
	return errs
}

// average runs a round on the listed ranks with their steps.
func (g *group) average(idx []int, round uint64, steps []uint64) map[int]error {
	g.t.Helper()
	return g.each(idx, func(ctx context.Context, r int) error {
		for i, x := range idx {
			if x == r {
				_, err := g.avgs[r].Average(ctx, plugin.Round{Round: round, Steps: steps[i]})
				return err
			}
		}
		return nil
	})
}

func (g *group) mustAverage(idx []int, round uint64, steps []uint64) {
	g.t.Helper()
	for r, err := range g.average(idx, round, steps) {
		if err != nil {
			g.t.Fatalf("round %d, rank %d: %v", round, r, err)
		}
	}
}

// values is rank r's f32 entry where its parameters live.
func (g *group) values(r, entry int) []float32 {
	if g.blocks != nil {
		off, n := g.span(r, entry)
		return g.block(r)[off : off+n]
	}
	v, _ := g.arenas[r].Float32s(entry)
	return append([]float32(nil), v...)
}

// newSession starts generation gen among members on each of them.
func (g *group) newSession(gen uint64, members []int) {
	g.t.Helper()
	global := make([]uint32, len(members))
	for i, m := range members {
		global[i] = uint32(m)
	}
	errs := g.each(members, func(ctx context.Context, r int) error {
		for i, m := range members {
			if m == r {
				return g.avgs[r].NewSession(ctx, plugin.Session{Generation: gen, NewRank: uint32(i), NewWorldSize: uint32(len(members)), Members: global})
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			g.t.Fatalf("NewSession %d on rank %d: %v", gen, r, err)
		}
	}
}

// kill takes rank r out as the core does when it dies.
func (g *group) kill(r int) {
	g.relay.Kill(uint32(r))
	g.each([]int{r}, func(ctx context.Context, r int) error { return g.avgs[r].Shutdown(ctx) })
}

// checkMean holds the listed ranks to the float64 weighted mean of pre's
// values of the ranks in from: parameters by steps^gamma, buffers equally
// among the ranks that trained.
func (g *group) checkMean(idx, from []int, pre map[int][][]float32, steps []uint64, gamma float64) {
	g.t.Helper()
	for entry, param := range []bool{true, false} {
		for k := range pre[from[0]][entry] {
			var sum, mag, total float64
			for i, r := range from {
				w := 0.0
				if steps[i] > 0 {
					w = math.Pow(float64(steps[i]), gamma)
					if !param {
						w = 1
					}
				}
				x := float64(pre[r][entry][k])
				sum, mag, total = sum+w*x, mag+w*math.Abs(x), total+w
			}
			want := sum / total
			for _, r := range idx {
				if got := float64(g.values(r, entry)[k]); math.Abs(got-want) > 1e-6*mag/total+1e-30 {
					g.t.Fatalf("rank %d entry %d [%d] = %v, want %v (steps %v of ranks %v)", r, entry, k, got, want, steps, from)
				}
			}
		}
	}
}

func (g *group) snapshot() map[int][][]float32 {
	s := map[int][][]float32{}
	for r := range g.avgs {
		s[r] = [][]float32{g.values(r, 0), g.values(r, 1)}
	}
	return s
}

func TestWeightedMean(t *testing.T) {
	tests := []struct {
		name     string
		steps    []uint64
		settings string
		gamma    float64
	}{
		{"1 rank", []uint64{3}, `{}`, 1},
		{"2 ranks", []uint64{1, 3}, `{}`, 1},
		{"3 ranks, gamma 2", []uint64{1, 2, 5}, `{"gamma": 2}`, 2},
		{"4 ranks, one idle", []uint64{4, 0, 2, 1}, `{}`, 1},
		{"4 ranks, gamma 0.5, two idle", []uint64{0, 9, 0, 4}, `{"gamma": 0.5}`, 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGroup(t, len(tc.steps), tc.settings)
			pre := g.snapshot()
			g.mustAverage(g.all(), 1, tc.steps)
			g.checkMean(g.all(), g.all(), pre, tc.steps, tc.gamma)
			if len(tc.steps) > 1 && g.fabric.Live() != len(tc.steps) {
				t.Errorf("%d live communicators, want one per rank", g.fabric.Live())
			}
		})
	}
}

// A rank that posts nothing into the communicator (it died after the id
// went round) does not hold its peers past init_timeout.
func TestInitTimeoutWhenAPeerNeverComes(t *testing.T) {
	g := newGroup(t, 2, `{"init_timeout": "300ms"}`)
	g.bes[1].Set(backend.Knobs{Absent: true})
	start := time.Now()
	errs := g.average(g.all(), 1, []uint64{1, 1})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the round took %v with init_timeout 300ms", d)
	}
	for r, err := range errs {
		if !errors.Is(err, plugin.ErrRoundAborted) || !strings.Contains(err.Error(), "init_timeout 300ms") {
			t.Errorf("rank %d: %v; want ErrRoundAborted naming init_timeout", r, err)
		}
	}
	if n := g.fabric.Live(); n != 0 {
		t.Errorf("%d communicators left after the failed init", n)
	}
	// The session is spent: the next round is refused at once.
	if err := g.average([]int{0}, 2, []uint64{1})[0]; !errors.Is(err, plugin.ErrRoundAborted) {
		t.Errorf("the round after a failed init: %v; want ErrRoundAborted", err)
	}
}

// Abort ends a collective a peer never completes, promptly, and aborts
// the communicator; the peer's side ends with it.
func TestAbortDuringBlockedCollective(t *testing.T) {
	g := newGroup(t, 2, `{}`)
	g.mustAverage(g.all(), 1, []uint64{1, 1})
	g.bes[1].Set(backend.Knobs{Stall: true})
	go func() {
		time.Sleep(100 * time.Millisecond)
		g.avgs[0].Abort(context.Background(), "watchdog")
	}()
	start := time.Now()
	errs := g.average(g.all(), 2, []uint64{1, 1})
	if d := time.Since(start); d > time.Second {
		t.Errorf("the aborted round took %v", d)
	}
	if !errors.Is(errs[0], ErrAborted) || !strings.Contains(errs[0].Error(), "watchdog") {
		t.Errorf("rank 0: %v; want ErrAborted with the reason", errs[0])
	}
	if !errors.Is(errs[1], plugin.ErrRoundAborted) {
		t.Errorf("rank 1 (stalled): %v; want ErrRoundAborted once its peer aborted", errs[1])
	}
	if n := g.fabric.Live(); n != 0 {
		t.Errorf("%d communicators left after the abort", n)
	}
	g.bes[1].Set(backend.Knobs{})
	g.newSession(1, g.all())
	pre := g.snapshot()
	g.mustAverage(g.all(), 3, []uint64{2, 1})
	g.checkMean(g.all(), g.all(), pre, []uint64{2, 1}, 1)
}

func TestRebuildAfterDeath(t *testing.T) {
	tests := []struct {
		name  string
		world int
		dead  []int
		// secondDead dies during the rebuild: it got the id but never
		// joins; the next session leaves it out too.
		secondDead int
	}{
		{name: "3 ranks, rank 0 dies", world: 3, dead: []int{0}, secondDead: -1},
		{name: "2 ranks, lone survivor", world: 2, dead: []int{0}, secondDead: -1},
		{name: "4 ranks, a second death during the rebuild", world: 4, dead: []int{0}, secondDead: 3},
		{name: "3 ranks, a second death leaves one", world: 3, dead: []int{1}, secondDead: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGroup(t, tc.world, `{"init_timeout": "300ms"}`)
			g.mustAverage(g.all(), 1, make([]uint64, tc.world))
			var survivors []int
			for r := range tc.world {
				if !slices.Contains(tc.dead, r) {
					survivors = append(survivors, r)
				}
			}
			for _, r := range tc.dead {
				g.kill(r)
			}
			g.newSession(1, survivors)
			gen := uint64(1)
			if tc.secondDead >= 0 {
				g.bes[tc.secondDead].Set(backend.Knobs{Absent: true})
				for r, err := range g.average(survivors, 2, ones(len(survivors))) {
					if !errors.Is(err, plugin.ErrRoundAborted) {
						t.Errorf("rank %d's round during the failed rebuild: %v; want ErrRoundAborted", r, err)
					}
				}
				g.kill(tc.secondDead)
				survivors = without(survivors, tc.secondDead)
				gen++
				g.newSession(gen, survivors)
			}
			pre := g.snapshot()
			steps := make([]uint64, len(survivors))
			for i := range steps {
				steps[i] = uint64(i + 1)
			}
			start := time.Now()
			g.mustAverage(survivors, 3, steps)
			g.checkMean(survivors, survivors, pre, steps, 1)
			want := len(survivors)
			if want == 1 {
				want = 0 // a session of one has no communicator
				if d := time.Since(start); d > 100*time.Millisecond {
					t.Errorf("a lone survivor's round took %v; nothing should wait", d)
				}
			}
			if n := g.fabric.Live(); n != want {
				t.Errorf("%d live communicators after the rebuild, want %d", n, want)
			}
		})
	}
}

// Ranks that share a GPU are folded there by their leader, which alone
// joins NCCL: the mean, the buffers' mean among the ranks that trained
// and a broadcast from a rank that leads nothing hold whatever the layout,
// every rank ends with the same bits, and the communicators are one per
// GPU (none for one GPU).
func TestSharedGPUs(t *testing.T) {
	tests := []struct {
		name    string
		devices int
		host    func(r int) string
		steps   []uint64
		gpus    int
	}{
		{"4 ranks on one GPU", 1, func(int) string { return "h0" }, []uint64{4, 0, 2, 1}, 1},
		{"2 GPUs of 2 ranks", 2, func(int) string { return "h0" }, []uint64{1, 2, 3, 0}, 2},
		{"2 hosts: 3 ranks on one GPU, 1 on another", 1, func(r int) string { return []string{"a", "a", "a", "b"}[r] }, []uint64{0, 5, 1, 2}, 2},
		{"a lone idle rank's GPU", 1, func(r int) string { return []string{"a", "a", "b"}[r] }, []uint64{1, 2, 0}, 2},
	}
	for _, tc := range tests {
		for _, device := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/parameters on the device=%v", tc.name, device), func(t *testing.T) {
				g := newGroupWith(t, len(tc.steps), `{"smoothing": 0}`, tc.devices, tc.host, device)
				sharedGPU(t, g, tc.steps, tc.gpus)
			})
		}
	}
}

// sharedGPU checks a mean over steps and a broadcast on g, whose ranks
// are on gpus GPUs.
func sharedGPU(t *testing.T, g *group, steps []uint64, gpus int) {
	pre := g.snapshot()
	g.mustAverage(g.all(), 1, steps)
	g.checkMean(g.all(), g.all(), pre, steps, 1)
	g.checkEqual()
	if want := gpus; want == 1 && g.fabric.Live() != 0 || want > 1 && g.fabric.Live() != want {
		t.Errorf("%d live communicators with %d GPUs", g.fabric.Live(), want)
	}
	// A broadcast from the last rank, which leads no GPU of several ranks
	// in these layouts.
	root := len(steps) - 1
	x := g.values(root, 0)
	copy(x, []float32{1.5, -2, 7})
	g.setValues(root, 0, x)
	want := g.values(root, 0)
	errs := g.each(g.all(), func(ctx context.Context, r int) error {
		_, err := g.avgs[r].Average(ctx, plugin.Round{Round: 2, Broadcast: true, Root: uint32(root)})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("broadcast, rank %d: %v", r, err)
		}
		if got := g.values(r, 0); !slices.Equal(got, want) {
			t.Fatalf("after the broadcast from rank %d, rank %d holds %v, want %v", root, r, got[:3], want[:3])
		}
	}
}

// checkEqual: every rank holds the same bits as rank 0.
func (g *group) checkEqual() {
	g.t.Helper()
	for r := range g.avgs {
		for entry := range 2 {
			if !slices.Equal(g.values(r, entry), g.values(0, entry)) {
				g.t.Fatalf("rank %d's entry %d differs from rank 0's", r, entry)
			}
		}
	}
}

// When a rank on a shared GPU dies, or its GPU's leader fails to fold, the
// round fails on every rank (its mates hear the leader's reason at once),
// and a new session of the survivors averages again.
func TestSharedGPUFailures(t *testing.T) {
	tests := []struct {
		name string
		fail func(g *group) []int // breaks the group, returns the survivors
	}{
		{"a mate dies", func(g *group) []int { g.kill(2); return []int{0, 1, 3} }},
		{"the leader dies", func(g *group) []int { g.kill(0); return []int{1, 2, 3} }},
		{"the leader's fold fails", func(g *group) []int {
			g.bes[0].Set(backend.Knobs{FoldErr: errors.New("illegal address")})
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Ranks 0 and 2 on one GPU, 1 and 3 on the other.
			g := newGroupOn(t, 4, `{}`, 2, func(int) string { return "h0" })
			g.mustAverage(g.all(), 1, ones(4))
			survivors := tc.fail(g)
			live := survivors
			if live == nil {
				live = g.all()
			}
			for r, err := range g.average(live, 2, ones(len(live))) {
				if !errors.Is(err, plugin.ErrRoundAborted) {
					t.Fatalf("rank %d's round: %v; want ErrRoundAborted", r, err)
				}
				if survivors == nil && r == 2 && !strings.Contains(err.Error(), "rank 0, this GPU's leader, failed the round: ") {
					t.Errorf("rank 2's error does not give its leader's reason: %v", err)
				}
			}
			if survivors == nil {
				g.bes[0].Set(backend.Knobs{})
			}
			g.newSession(1, live)
			pre := g.snapshot()
			steps := make([]uint64, len(live))
			for i := range steps {
				steps[i] = uint64(i + 1)
			}
			g.mustAverage(live, 3, steps)
			g.checkMean(live, live, pre, steps, 1)
		})
	}
}

func TestConfigureRefuses(t *testing.T) {
	tests := []struct {
		name, settings string
		devices        int
		want           string
	}{
		{"no GPU", `{}`, 0, "no usable GPU: cudaGetDeviceCount: no CUDA-capable device"},
		{"device beyond the host's", `{"device": 2}`, 2, "device = 2, but this process sees 2 GPUs"},
		{"unknown key", `{"gama": 2}`, 1, "gama"},
		{"bad init_timeout", `{"init_timeout": "1ns"}`, 1, "init_timeout"},
		{"the trainer's GPU is not here", `{}`, 2, "the trainer's parameters are on GPU elsewhere/0, which is none of the 2 this process sees"},
		{"device set against the trainer's GPU", `{"device": 1}`, 2, "device = 1, but the trainer's parameters are on device 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := backend.NewFabric(tc.devices)
			a := New(nil, func(cudalib.Options) (backend.Backend, error) { return f.Backend(), nil })
			ar, err := arena.Create(t.TempDir(), "nccl-refuse", testLayout(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ar.Remove()
			d := ar.Descriptor()
			if strings.Contains(tc.name, "trainer's GPU") {
				gpu := "h0/0"
				if strings.Contains(tc.name, "not here") {
					gpu = "elsewhere/0"
				}
				d.Device = &arena.DeviceBlock{GPU: gpu, Size: d.Layout.DeviceBytes()}
			}
			_, err = a.Configure(context.Background(), plugin.AveragerConfig{WorldSize: 1, Arena: d, Settings: []byte(tc.settings)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Configure: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

func without(s []int, x int) []int {
	var out []int
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func ones(n int) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// FuzzRelayPosts: whatever a rank posts, the decoders of a session's GPU
// post and of a round's weighing never panic, refuse what is not one, and
// decode what they accept to what encodes back to the same bytes.
func FuzzRelayPosts(f *testing.F) {
	f.Add(gpuPost{size: 1 << 20, handle: backend.IPCHandle{1, 2, 3}, gpu: "boot/0000:3b:00.0"}.encode())
	f.Add(weighing{w: 2.5, trained: 1, sm: 0.5, steps: 7}.encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := decodeGPUPost(b); err == nil {
			if !bytes.Equal(p.encode(), b) || p.gpu == "" || len(p.gpu) > maxGPUName {
				t.Fatalf("decoded %d bytes to %+v, which encodes to other bytes", len(b), p)
			}
		}
		if x, err := decodeWeighing(b); err == nil {
			if !bytes.Equal(x.encode(), b) {
				t.Fatalf("decoded %x to %+v, which encodes to other bytes", b, x)
			}
		} else if len(b) == weighingSize {
			t.Fatalf("a weighing of %d bytes refused: %v", len(b), err)
		}
	})
}
