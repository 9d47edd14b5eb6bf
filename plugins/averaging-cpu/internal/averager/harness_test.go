package averager

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugintest"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/reduceserver"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/mtls"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The tests run the real reduce server in process and one Averager per
// rank, each on its own arena file, exactly as the plugin processes would.

var testKey = []byte("0123456789abcdef0123456789abcdef")

const testRun = "run-test"

// testLayout: parameters of awkward sizes, an f32 buffer, and an i64 buffer
// that must stay local.
func testLayout(t testing.TB, scale int) arena.Layout {
	t.Helper()
	l, err := arena.Pack([]arena.Entry{
		{Name: "w1", DType: arena.F32, Shape: []int64{int64(37 * scale), 13}, Role: arena.Parameter},
		{Name: "b1", DType: arena.F32, Shape: []int64{13}, Role: arena.Parameter},
		{Name: "bn.mean", DType: arena.F32, Shape: []int64{29}, Role: arena.Buffer},
		{Name: "bn.count", DType: arena.I64, Shape: []int64{3}, Role: arena.Buffer},
		{Name: "w2", DType: arena.F32, Shape: []int64{int64(1001 * scale)}, Role: arena.Parameter},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type cohort struct {
	t      testing.TB
	srv    *reduceserver.Server
	log    *plugintest.LogBuffer
	dir    string
	layout arena.Layout
	maps   []*arena.Mapping
	avgs   []*Averager
	traits []plugin.AveragerTraits // what each rank's Configure said
	// rankTLS is every rank's AveragerConfig.TLS.
	rankTLS *plugin.TLSFiles
}

type cohortOpts struct {
	world    int
	settings []map[string]any // per rank (nil: {})
	scale    int
	noServer bool
	timeout  time.Duration
	// tls, when set, is a cluster's directory (mtls.WriteCluster, hosts
	// "coord" and "node"): the server runs mutual TLS with coord's files
	// and every rank gets node's.
	tls string
}

func newCohort(t testing.TB, o cohortOpts) *cohort {
	t.Helper()
	if o.scale == 0 {
		o.scale = 1
	}
	c := &cohort{t: t, log: &plugintest.LogBuffer{}, dir: t.TempDir(), layout: testLayout(t, o.scale)}
	logger := hclog.New(&hclog.LoggerOptions{Output: c.log, Level: hclog.Debug})
	timeout := o.timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	var serverTLS *tls.Config
	if o.tls != "" {
		var err error
		if serverTLS, err = mtls.HostFiles(o.tls, "coord").ServerConfig(); err != nil {
			t.Fatal(err)
		}
		files := mtls.HostFiles(o.tls, "node")
		c.rankTLS = &files
	}
	srv, err := reduceserver.Listen(context.Background(), reduceserver.Config{
		Addr: "127.0.0.1:0", Key: testKey, RunID: testRun, World: uint32(o.world), Layout: &c.layout,
		Logger: logger, Timeout: timeout, TLS: serverTLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	c.srv = srv
	t.Cleanup(func() {
		for _, a := range c.avgs {
			a.Shutdown(context.Background())
		}
		srv.Close()
		for _, m := range c.maps {
			m.Close()
		}
		if t.Failed() {
			t.Logf("server log:\n%s", c.log.String())
		}
	})
	c.maps = make([]*arena.Mapping, o.world)
	c.avgs = make([]*Averager, o.world)
	c.traits = make([]plugin.AveragerTraits, o.world)
	for r := 0; r < o.world; r++ {
		c.maps[r] = makeArena(t, c.dir, r, c.layout)
	}
	var wg sync.WaitGroup
	errs := make([]error, o.world)
	for r := 0; r < o.world; r++ {
		var set map[string]any
		if o.settings != nil {
			set = o.settings[r]
		}
		c.avgs[r] = New(logger.Named(fmt.Sprintf("rank%d", r)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.traits[r], errs[r] = c.avgs[r].Configure(context.Background(), c.config(r, set))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("configure rank %d: %v", r, err)
		}
	}
	return c
}

func (c *cohort) config(r int, set map[string]any) plugin.AveragerConfig {
	if set == nil {
		set = map[string]any{}
	}
	if _, ok := set["timeout"]; !ok {
		set["timeout"] = "5s"
	}
	raw, _ := json.Marshal(set)
	return plugin.AveragerConfig{
		Rank: uint32(r), WorldSize: uint32(len(c.maps)), Arena: c.maps[r].Descriptor(),
		Endpoint: c.srv.Addr(), DataKey: testKey, Settings: raw, RunID: testRun, TLS: c.rankTLS,
	}
}

func makeArena(t testing.TB, dir string, r int, l arena.Layout) *arena.Mapping {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("rank%d.arena", r))
	if err := os.WriteFile(path, make([]byte, l.Size), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := arena.Open(arena.Descriptor{Path: path, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fill gives every f32 value of rank r's arena a deterministic random value
// and the i64 buffer a marker.
func (c *cohort) fill(seed uint64) {
	for r, m := range c.maps {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		for i, e := range c.layout.Entries {
			b, _ := m.Tensor(i)
			if e.DType == arena.I64 {
				for k := range b {
					b[k] = byte(r + 1)
				}
				continue
			}
			f := arena.AsFloat32s(b)
			for k := range f {
				f[k] = float32(rng.NormFloat64()) + float32(r)
			}
		}
	}
}

// snapshot copies every rank's f32 values per entry.
func (c *cohort) snapshot() [][][]float32 {
	out := make([][][]float32, len(c.maps))
	for r, m := range c.maps {
		for i, e := range c.layout.Entries {
			if e.DType != arena.F32 {
				out[r] = append(out[r], nil)
				continue
			}
			f, _ := m.Float32s(i)
			out[r] = append(out[r], append([]float32(nil), f...))
		}
	}
	return out
}

// roundAll runs one round on every rank concurrently.
func (c *cohort) roundAll(ctx context.Context, rounds []plugin.Round) ([]plugin.RoundResult, []error) {
	res := make([]plugin.RoundResult, len(c.avgs))
	errs := make([]error, len(c.avgs))
	var wg sync.WaitGroup
	for r, a := range c.avgs {
		if a == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r], errs[r] = a.Average(ctx, rounds[r])
		}()
	}
	wg.Wait()
	return res, errs
}

func sameRound(n int, rq plugin.Round, steps []uint64) []plugin.Round {
	out := make([]plugin.Round, n)
	for r := range out {
		out[r] = rq
		if steps != nil {
			out[r].Steps = steps[r]
		}
	}
	return out
}

func gammaMass(n uint64, g float64) float64 {
	if n == 0 {
		return 0
	}
	return math.Pow(float64(n), g)
}

// reference is the float64 weighted mean of pre per entry: parameters by
// steps^gamma, f32 buffers among movers.
func reference(l arena.Layout, pre [][][]float32, steps []uint64, gamma float64) [][]float64 {
	out := make([][]float64, len(l.Entries))
	for i, e := range l.Entries {
		if e.DType != arena.F32 {
			continue
		}
		n := len(pre[0][i])
		out[i] = make([]float64, n)
		var wsum float64
		for r := range pre {
			w := gammaMass(steps[r], gamma)
			if e.Role == arena.Buffer && w > 0 {
				w = 1
			}
			wsum += w
			for k := 0; k < n; k++ {
				out[i][k] += w * float64(pre[r][i][k])
			}
		}
		for k := range out[i] {
			out[i][k] /= wsum
		}
	}
	return out
}

// relErr is ‖got − want‖ / ‖want‖ over one tensor.
func relErr(got []float32, want []float64) float64 {
	var d, w float64
	for k := range want {
		x := float64(got[k]) - want[k]
		d += x * x
		w += want[k] * want[k]
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}
