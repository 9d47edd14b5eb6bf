package backend

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
)

// Fabric is a fake NCCL for tests on machines without a GPU: the backends
// it makes are ranks in this process whose communicators meet by unique
// id, whose device buffers are host memory, and whose knobs make a rank
// never arrive, stall in a collective, or fail.
type Fabric struct {
	devices int

	mu     sync.Mutex
	groups map[UniqueID]*group
	live   int
}

// NewFabric is a fabric whose hosts each see devices GPUs (0: none, and
// DeviceCount fails as CUDA does on such a host).
func NewFabric(devices int) *Fabric {
	return &Fabric{devices: devices, groups: map[UniqueID]*group{}}
}

// Live is how many communicators are built and not aborted.
func (f *Fabric) Live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live
}

// Knobs make a fake rank misbehave.
type Knobs struct {
	// Absent: InitComm never joins (a peer that never comes); it waits
	// for its context.
	Absent bool
	// Stall: the rank's collectives never reach the others (a rank
	// wedged mid-collective); they wait for their context or an abort.
	Stall bool
	// InitErr and CollectiveErr make InitComm and the collectives fail.
	InitErr, CollectiveErr error
}

// Fake is one rank's Backend on a Fabric.
type Fake struct {
	f     *Fabric
	mu    sync.Mutex
	knobs Knobs
}

// Backend makes a rank's backend.
func (f *Fabric) Backend() *Fake { return &Fake{f: f} }

// Set replaces the rank's knobs; operations already waiting keep theirs.
func (b *Fake) Set(k Knobs) {
	b.mu.Lock()
	b.knobs = k
	b.mu.Unlock()
}

func (b *Fake) get() Knobs {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.knobs
}

// DeviceCount is the fabric's devices, an error when there are none.
func (b *Fake) DeviceCount() (int, error) {
	if b.f.devices == 0 {
		return 0, errors.New("cudaGetDeviceCount: no CUDA-capable device is detected (code 100)")
	}
	return b.f.devices, nil
}

// NewUniqueID is random bytes.
func (b *Fake) NewUniqueID() (UniqueID, error) {
	var id UniqueID
	_, err := rand.Read(id[:])
	return id, err
}

// Close does nothing: the fabric outlives its backends.
func (b *Fake) Close() error { return nil }

// group is one communicator: its ranks and their collectives in flight.
type group struct {
	n      int
	joined int
	ready  chan struct{} // closed when every rank has joined
	// broken is closed when a member aborts: its peers' operations then
	// fail, as NCCL's do once an aborted peer's connections close.
	broken     chan struct{}
	breakOnce  sync.Once
	ops        map[uint64]*op
	breakCause string
}

func (g *group) breakWith(cause string) {
	g.breakOnce.Do(func() { g.breakCause = cause; close(g.broken) })
}

// op is one collective: each rank's contribution, then the result.
type op struct {
	bufs    [][]byte
	arrived int
	done    chan struct{}
	result  []byte
}

// InitComm joins the group of id and waits until all nranks have.
func (b *Fake) InitComm(ctx context.Context, id UniqueID, nranks, rank, device int) (Comm, error) {
	k := b.get()
	fail := func(err error) (Comm, error) {
		return nil, fmt.Errorf("fake nccl: init rank %d of %d on device %d: %w", rank, nranks, device, err)
	}
	switch {
	case device < 0 || device >= b.f.devices:
		return fail(fmt.Errorf("no device %d (the host has %d)", device, b.f.devices))
	case rank < 0 || rank >= nranks:
		return fail(fmt.Errorf("rank out of range"))
	case k.InitErr != nil:
		return fail(fmt.Errorf("%w: %w", ErrAborted, k.InitErr))
	case k.Absent:
		<-ctx.Done()
		return fail(fmt.Errorf("%w: %w", ErrAborted, ctx.Err()))
	}
	b.f.mu.Lock()
	g := b.f.groups[id]
	if g == nil {
		g = &group{n: nranks, ready: make(chan struct{}), broken: make(chan struct{}), ops: map[uint64]*op{}}
		b.f.groups[id] = g
	}
	if g.n != nranks {
		b.f.mu.Unlock()
		return fail(fmt.Errorf("the communicator has %d ranks", g.n))
	}
	g.joined++
	if g.joined == g.n {
		close(g.ready)
	}
	b.f.live++
	b.f.mu.Unlock()
	c := &fakeComm{b: b, g: g, rank: rank, aborted: make(chan struct{})}
	select {
	case <-g.ready:
		return c, nil
	case <-g.broken:
		return fail(errors.Join(fmt.Errorf("%w: a peer aborted (%s)", ErrAborted, g.breakCause), c.Abort()))
	case <-ctx.Done():
		return fail(errors.Join(fmt.Errorf("%w: %w", ErrAborted, ctx.Err()), c.Abort()))
	}
}

type fakeComm struct {
	b         *Fake
	g         *group
	rank      int
	seq       uint64
	abortOnce sync.Once
	aborted   chan struct{}
}

func (c *fakeComm) Abort() error {
	c.abortOnce.Do(func() {
		close(c.aborted)
		c.b.f.mu.Lock()
		c.b.f.live--
		c.b.f.mu.Unlock()
		c.g.breakWith(fmt.Sprintf("rank %d aborted", c.rank))
	})
	return nil
}

func (c *fakeComm) isAborted() bool {
	select {
	case <-c.aborted:
		return true
	default:
		return false
	}
}

func (c *fakeComm) Alloc(n int) (Buffer, error) {
	if c.isAborted() {
		return nil, ErrAborted
	}
	return &fakeBuffer{c: c, b: make([]byte, n)}, nil
}

func (c *fakeComm) AllReduceSum(ctx context.Context, buf Buffer, dt DType) error {
	return c.collective(ctx, "all-reduce", buf, func(bufs [][]byte) []byte { return sum(bufs, dt) })
}

func (c *fakeComm) Broadcast(ctx context.Context, buf Buffer, dt DType, root int) error {
	if root < 0 || root >= c.g.n {
		return fmt.Errorf("fake nccl: broadcast root %d of %d ranks", root, c.g.n)
	}
	return c.collective(ctx, "broadcast", buf, func(bufs [][]byte) []byte { return bufs[root] })
}

// collective contributes buf to the group's next operation and waits for
// its result, which combine makes from every rank's buffer.
func (c *fakeComm) collective(ctx context.Context, name string, buf Buffer, combine func([][]byte) []byte) error {
	fb := buf.(*fakeBuffer)
	if c.isAborted() {
		return fmt.Errorf("fake nccl: %s: %w", name, ErrAborted)
	}
	k := c.b.get()
	if k.CollectiveErr != nil {
		return fmt.Errorf("fake nccl: %s: %w", name, errors.Join(fmt.Errorf("%w: %w", ErrAborted, k.CollectiveErr), c.Abort()))
	}
	c.seq++
	done := make(chan struct{}) // never closed for a stalled rank
	var o *op
	if !k.Stall {
		c.b.f.mu.Lock()
		o = c.g.ops[c.seq]
		if o == nil {
			o = &op{bufs: make([][]byte, c.g.n), done: make(chan struct{})}
			c.g.ops[c.seq] = o
		}
		o.bufs[c.rank] = append([]byte(nil), fb.b...)
		if o.arrived++; o.arrived == c.g.n {
			o.result = combine(o.bufs)
			delete(c.g.ops, c.seq)
			close(o.done)
		}
		c.b.f.mu.Unlock()
		done = o.done
	}
	select {
	case <-done:
		copy(fb.b, o.result)
		return nil
	case <-c.aborted:
		return fmt.Errorf("fake nccl: %s: %w", name, ErrAborted)
	case <-c.g.broken:
		return fmt.Errorf("fake nccl: %s: %w", name, errors.Join(fmt.Errorf("%w: a peer aborted (%s)", ErrAborted, c.g.breakCause), c.Abort()))
	case <-ctx.Done():
		return fmt.Errorf("fake nccl: %s: %w", name, errors.Join(fmt.Errorf("%w: %w", ErrAborted, ctx.Err()), c.Abort()))
	}
}

// sum adds the buffers elementwise in rank order, in dt's precision, as
// one reduction every rank then receives.
func sum(bufs [][]byte, dt DType) []byte {
	out := append([]byte(nil), bufs[0]...)
	le := binary.LittleEndian
	for _, b := range bufs[1:] {
		for i := 0; i+dt.Size() <= len(out); i += dt.Size() {
			if dt == Float64 {
				le.PutUint64(out[i:], math.Float64bits(math.Float64frombits(le.Uint64(out[i:]))+math.Float64frombits(le.Uint64(b[i:]))))
			} else {
				le.PutUint32(out[i:], math.Float32bits(math.Float32frombits(le.Uint32(out[i:]))+math.Float32frombits(le.Uint32(b[i:]))))
			}
		}
	}
	return out
}

type fakeBuffer struct {
	c *fakeComm
	b []byte
}

func (b *fakeBuffer) Len() int { return len(b.b) }

func (b *fakeBuffer) Write(src []byte) error {
	if b.c.isAborted() {
		return ErrAborted
	}
	if len(src) > len(b.b) {
		return fmt.Errorf("fake nccl: write of %d bytes into a buffer of %d", len(src), len(b.b))
	}
	copy(b.b, src)
	return nil
}

func (b *fakeBuffer) Read(dst []byte) error {
	if b.c.isAborted() {
		return ErrAborted
	}
	if len(dst) > len(b.b) {
		return fmt.Errorf("fake nccl: read of %d bytes from a buffer of %d", len(dst), len(b.b))
	}
	copy(dst, b.b)
	return nil
}
