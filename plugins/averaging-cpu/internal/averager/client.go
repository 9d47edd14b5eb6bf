package averager

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/plugins/averaging-cpu/internal/ring"
	"github.com/cohortdl/cohort/plugins/averaging-cpu/internal/shm"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/mtls"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// span is one f32 tensor of the arena in the reduce order: elements
// [idx, idx+n) of the reduce space live at float offset off of every arena.
type span struct {
	off, idx, n int
	param       bool
}

// client is one configured membership: the arena, the data channel, the
// host's shared memory.
type client struct {
	log    hclog.Logger
	cfg    config
	rank   uint32
	world  uint32
	own    *arena.Mapping
	layout arena.Layout
	spans  []span
	np, nb int
	host   [16]byte
	dir    string
	segTag string

	conn       *reduce.Conn
	ring       *ring.Listener
	ringKeys   ring.Keys
	links      ringLinks // this leader's ring links, kept across rounds
	run        [16]byte
	inbox      chan inMsg
	quit       chan struct{}
	readerDone chan struct{}
	fatal      error

	topo  *topology
	peers map[uint32]*shm.Region
	outer *shm.Region // prev | vel, host-shared
	fold  *shm.Region // see sendArea; host-shared, several hosts only

	outerSteps uint64
	outerID    [8]byte
	resid      residual // a host leader's, on a bf16 wire
}

// residual is what a host leader's bf16 roundings dropped (the
// parameters' only), valid for the round after the one of outer step
// steps under topology gen when ok.
type residual struct {
	v          []float32
	ok         bool
	gen, steps uint64
}

type topology struct {
	gen     uint64
	hosts   uint32
	host    uint32   // this host's place in the ring
	ranks   []uint32 // the host's ranks, leader first
	leaders []string // every host leader's ring address, in host order
}

func newClient(ctx context.Context, log hclog.Logger, cfg plugin.AveragerConfig) (_ *client, err error) {
	set, err := parseSettings(cfg.Settings)
	if err != nil {
		return nil, err
	}
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return nil, fmt.Errorf("averager: rank %d out of range for world size %d", cfg.Rank, cfg.WorldSize)
	}
	keys, err := reduce.DeriveKeys(cfg.DataKey)
	if err != nil {
		return nil, fmt.Errorf("averager: %w", err)
	}
	ringKeys, err := ring.DeriveKeys(cfg.DataKey)
	if err != nil {
		return nil, fmt.Errorf("averager: %w", err)
	}
	// The leaders' links run inside the run's mutual TLS too.
	ringKeys = ringKeys.WithTLS(cfg.TLS)
	if cfg.Endpoint == "" {
		return nil, errors.New("averager: no reduce server endpoint")
	}
	set = set.forLayout(cfg.Arena.Layout)
	spans, np, nb, err := buildSpans(cfg.Arena.Layout)
	if err != nil {
		return nil, err
	}
	own, err := arena.Open(cfg.Arena)
	if err != nil {
		return nil, fmt.Errorf("averager: %w", err)
	}
	c := &client{
		log: log, cfg: set, rank: cfg.Rank, world: cfg.WorldSize, own: own, layout: cfg.Arena.Layout,
		spans: spans, np: np, nb: nb, peers: map[uint32]*shm.Region{}, ringKeys: ringKeys, run: reduce.RunDigest(cfg.RunID),
		inbox: make(chan inMsg, 64), quit: make(chan struct{}), readerDone: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	c.dir = set.shmDir
	if c.dir == "" {
		c.dir = filepath.Dir(cfg.Arena.Path)
	}
	if c.host, err = hostKey(set.host, cfg.Rank, c.dir); err != nil {
		return nil, err
	}
	digest := cfg.Arena.Layout.Digest()
	seg := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%x\x00%x\x00%v", cfg.RunID, c.host, digest, set.wire)))
	c.segTag = fmt.Sprintf("cohort-avg-%x", seg[:12])
	if set.outer.Kind != numeric.OuterNone && np > 0 {
		if c.outer, err = shm.OpenShared(c.dir, c.segTag+".outer", uint64(np)*8); err != nil {
			return nil, fmt.Errorf("averager: outer optimizer state: %w", err)
		}
	}
	dev, ino, err := shm.FileID(cfg.Arena.Path)
	if err != nil {
		return nil, fmt.Errorf("averager: %w", err)
	}
	var tlsCfg *tls.Config
	if cfg.TLS != nil {
		if tlsCfg, err = cfg.TLS.ClientConfigFor(cfg.Endpoint); err != nil {
			return nil, fmt.Errorf("averager: %w", err)
		}
	}
	if c.ring, err = listenRing(set.ringPort, ringKeys, c.run, set.timeout); err != nil {
		return nil, err
	}
	nc, err := dial(ctx, cfg.Endpoint, set.connectTimeout)
	if err != nil {
		return nil, err
	}
	hello := reduce.Hello{Rank: cfg.Rank, World: cfg.WorldSize, Wire: set.wire, Params: uint64(np), Buffers: uint64(nb),
		Run: c.run, Layout: digest, Settings: set.digest(), Host: c.host}
	hctx, cancel := context.WithTimeout(ctx, set.connectTimeout)
	defer cancel()
	if tlsCfg != nil {
		if nc, err = mtls.Client(hctx, nc, tlsCfg, set.timeout, "the reduce server"); err != nil {
			return nil, fmt.Errorf("averager: reduce server %s: %w", cfg.Endpoint, err)
		}
	}
	if c.conn, err = reduce.ClientHandshake(hctx, nc, keys, hello, reduce.Options{Timeout: set.timeout}); err != nil {
		// Under TLS 1.3 a refused certificate is an alert in place of the ack.
		return nil, fmt.Errorf("averager: reduce server %s: %w", cfg.Endpoint, mtls.Explain(err, "the reduce server"))
	}
	go c.readLoop()
	join := reduce.Join{ArenaPath: cfg.Arena.Path, Dev: dev, Ino: ino, PID: uint32(os.Getpid()), RingPort: c.ring.Port()}
	if err := c.conn.Send(ctx, reduce.KindJoin, join.Encode()); err != nil {
		return nil, fmt.Errorf("averager: join: %w", err)
	}
	log.Debug("joined the reduce server", "endpoint", cfg.Endpoint, "rank", cfg.Rank, "params", np, "buffers", nb, "wire", set.wire.String(),
		"kernels", cmp.Or(numeric.Vector, "scalar"))
	return c, nil
}

// buildSpans lists the layout's f32 tensors in the reduce order: parameters
// first, then buffers. Other parameter types are refused; other buffer
// types stay local.
func buildSpans(l arena.Layout) (spans []span, np, nb int, err error) {
	if err := l.Validate(); err != nil {
		return nil, 0, 0, fmt.Errorf("averager: %w", err)
	}
	idx := 0
	for pass := 0; pass < 2; pass++ {
		for _, e := range l.Entries {
			if (pass == 0) != (e.Role == arena.Parameter) {
				continue
			}
			if e.DType != arena.F32 {
				if e.Role == arena.Parameter {
					return nil, 0, 0, fmt.Errorf("averager: parameter %q is %v; averaging-cpu averages f32 parameters only", e.Name, e.DType)
				}
				continue
			}
			n := int(e.Bytes / 4)
			if n == 0 {
				continue
			}
			spans = append(spans, span{off: int(e.Offset / 4), idx: idx, n: n, param: pass == 0})
			idx += n
			if pass == 0 {
				np += n
			} else {
				nb += n
			}
		}
	}
	return spans, np, nb, nil
}

// hostKey names this rank's shared-memory domain.
func hostKey(setting string, rank uint32, dir string) ([16]byte, error) {
	var src string
	switch setting {
	case "":
		name, _ := os.Hostname()
		boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil {
			return [16]byte{}, fmt.Errorf("averager: shared-memory directory: %w", err)
		}
		src = fmt.Sprintf("auto\x00%s\x00%s\x00%d", name, strings.TrimSpace(string(boot)), st.Dev)
	case "rank":
		src = fmt.Sprintf("rank\x00%d", rank)
	default:
		src = "name\x00" + setting
	}
	h := sha256.Sum256([]byte("cohort/averaging-cpu/host/" + src))
	var k [16]byte
	copy(k[:], h[:])
	return k, nil
}

func dial(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	backoff := 20 * time.Millisecond
	var d net.Dialer
	for {
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return nc, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("averager: reach reduce server %s within %v: %w", addr, timeout, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// inMsg is one decoded frame from the server, or the channel's end.
type inMsg struct {
	kind  reduce.Kind
	round uint64
	topo  reduce.Topology
	plan  reduce.Plan
	res   reduce.Result
	fail  reduce.Fail
	err   error
}

func (c *client) readLoop() {
	defer close(c.readerDone)
	for {
		f, err := c.conn.Receive()
		var m inMsg
		if err == nil {
			m, err = decode(f)
		}
		if err != nil {
			c.conn.Close()
			m = inMsg{err: err}
		}
		select {
		case c.inbox <- m:
		case <-c.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

func decode(f reduce.Frame) (inMsg, error) {
	m := inMsg{kind: f.Kind}
	var err error
	switch f.Kind {
	case reduce.KindTopology:
		m.topo, err = reduce.DecodeTopology(f.Payload)
		m.round = 0
	case reduce.KindPlan:
		m.plan, err = reduce.DecodePlan(f.Payload)
		m.round = m.plan.Round
	case reduce.KindSend, reduce.KindApply:
		var r reduce.RoundRef
		r, err = reduce.DecodeRoundRef(f.Kind, f.Payload)
		m.round = r.Round
	case reduce.KindResult:
		m.res, err = reduce.DecodeResult(f.Payload)
		m.round = m.res.Round
	case reduce.KindFail:
		m.fail, err = reduce.DecodeFail(f.Payload)
		m.round = m.fail.Round
	default:
		err = fmt.Errorf("unexpected %v frame from the reduce server", f.Kind)
	}
	return m, err
}

// applyTopology maps the arenas of the host's other ranks and, when the
// cohort spans hosts, the host's fold segment (kept until close).
func (c *client) applyTopology(t reduce.Topology) error {
	if t.Hosts > 1 && c.fold == nil {
		f, err := shm.OpenShared(c.dir, c.segTag+".fold", uint64(c.np+c.nb)*8)
		if err != nil {
			return fmt.Errorf("host fold segment: %w", err)
		}
		c.fold = f
	}
	me := -1
	keep := map[uint32]bool{}
	for i, p := range t.Peers {
		keep[p.Rank] = true
		if p.Rank == c.rank {
			me = i
			continue
		}
		if _, ok := c.peers[p.Rank]; ok {
			continue
		}
		r, err := shm.MapPeer(p.Path, p.Dev, p.Ino, c.layout.Size)
		if err != nil {
			return fmt.Errorf("rank %d shares this host's key but its arena cannot be used here: %w (set host = \"rank\" if the ranks do not share /dev/shm)", p.Rank, err)
		}
		c.peers[p.Rank] = r
	}
	if me < 0 {
		return fmt.Errorf("topology %d of the reduce server does not list this rank %d", t.Generation, c.rank)
	}
	for r, m := range c.peers {
		if !keep[r] {
			m.Close()
			delete(c.peers, r)
		}
	}
	if c.links.gen != t.Generation {
		c.dropLinks() // the ring's members or order may have changed
	}
	tp := &topology{gen: t.Generation, hosts: t.Hosts, host: t.Host, leaders: t.Leaders}
	for _, p := range t.Peers {
		tp.ranks = append(tp.ranks, p.Rank)
	}
	c.topo = tp
	c.log.Debug("topology", "generation", t.Generation, "hosts", t.Hosts, "host_ranks", tp.ranks)
	return nil
}

// floats is rank r's arena as float32 values.
func (c *client) floats(r uint32) []float32 {
	if r == c.rank {
		return numeric.Float32s(c.own.Bytes())
	}
	return numeric.Float32s(c.peers[r].Bytes())
}

// threads is how many goroutines reduce this rank's slice when the host
// has l ranks.
func (c *client) threads(l int) int {
	if c.cfg.threads > 0 {
		return c.cfg.threads
	}
	return max(1, runtime.GOMAXPROCS(0)/l)
}

func (c *client) close() error {
	var errs []error
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.conn.Send(ctx, reduce.KindBye)
		cancel()
		c.conn.Close()
		close(c.quit)
		<-c.readerDone
	}
	c.dropLinks()
	if c.ring != nil {
		errs = append(errs, c.ring.Close())
	}
	for r, p := range c.peers {
		errs = append(errs, p.Close())
		delete(c.peers, r)
	}
	if c.fold != nil {
		errs = append(errs, c.fold.Close())
	}
	if c.outer != nil {
		errs = append(errs, c.outer.Close())
	}
	if c.own != nil {
		errs = append(errs, c.own.Close())
	}
	return errors.Join(errs...)
}
