package backend

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Fabric is a fake NCCL for tests on machines without a GPU: the backends
// it makes are ranks in this process, on hosts the test names, whose
// communicators meet by unique id, whose device memory is host memory that
// ranks of the same host and device can map by handle, and whose knobs
// make a rank never arrive, stall in a collective, or fail.
type Fabric struct {
	devices int

	mu     sync.Mutex
	groups map[UniqueID]*group
	live   int
	mems   map[IPCHandle]*fakeAlloc
}

// NewFabric is a fabric whose hosts each see devices GPUs (0: none, and
// DeviceCount fails as CUDA does on such a host).
func NewFabric(devices int) *Fabric {
	return &Fabric{devices: devices, groups: map[UniqueID]*group{}, mems: map[IPCHandle]*fakeAlloc{}}
}

// Allocated is how many device allocations are not freed.
func (f *Fabric) Allocated() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mems)
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
	// InitErr and CollectiveErr make InitComm and the collectives fail;
	// FoldErr makes Scale, Axpy and Copy fail.
	InitErr, CollectiveErr, FoldErr error
}

// Fake is one rank's Backend on a Fabric: one process on one host.
type Fake struct {
	f     *Fabric
	host  string
	mu    sync.Mutex
	knobs Knobs
}

// Backend makes the backend of a rank on the fabric's first host.
func (f *Fabric) Backend() *Fake { return f.BackendOn("h0") }

// BackendOn makes the backend of a rank on host: ranks of one host share
// its devices.
func (f *Fabric) BackendOn(host string) *Fake { return &Fake{f: f, host: host} }

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

// DeviceID is the host's name and the device's index.
func (b *Fake) DeviceID(device int) (string, error) {
	if device < 0 || device >= b.f.devices {
		return "", fmt.Errorf("fake cuda: no device %d (the host has %d)", device, b.f.devices)
	}
	return fmt.Sprintf("%s/%d", b.host, device), nil
}

// fakeAlloc is one allocation: its bytes, where it lives, who made it.
type fakeAlloc struct {
	b      []byte
	host   string
	device int
	owner  *Fake
	freed  bool
}

// Alloc is host memory registered under a random handle.
func (b *Fake) Alloc(device, n int) (Memory, error) {
	if device < 0 || device >= b.f.devices {
		return nil, fmt.Errorf("fake cuda: alloc on device %d (the host has %d)", device, b.f.devices)
	}
	a := &fakeAlloc{b: make([]byte, n), host: b.host, device: device, owner: b}
	var h IPCHandle
	rand.Read(h[:])
	b.f.mu.Lock()
	b.f.mems[h] = a
	b.f.mu.Unlock()
	return &fakeMemory{f: b.f, a: a, h: h}, nil
}

// Open maps an allocation of another rank of the same host and device, as
// cudaIpcOpenMemHandle does (a process's own handle does not open).
func (b *Fake) Open(device int, h IPCHandle, n int) (Memory, error) {
	b.f.mu.Lock()
	a := b.f.mems[h]
	b.f.mu.Unlock()
	switch {
	case a == nil:
		return nil, errors.New("fake cuda: open: no memory has this handle (freed, or never made)")
	case a.host != b.host:
		return nil, fmt.Errorf("fake cuda: open: the memory is on host %s, this rank on %s", a.host, b.host)
	case a.device != device:
		return nil, fmt.Errorf("fake cuda: open: the memory is on device %d, not %d", a.device, device)
	case a.owner == b:
		return nil, errors.New("fake cuda: open: a process cannot open its own memory's handle")
	case n > len(a.b):
		return nil, fmt.Errorf("fake cuda: open: %d bytes of an allocation of %d", n, len(a.b))
	}
	return &fakeMemory{f: b.f, a: a, opened: true, n: n}, nil
}

func (b *Fake) fold(name string, ms ...Memory) ([][]float32, error) {
	if err := b.get().FoldErr; err != nil {
		return nil, fmt.Errorf("fake cublas: %s: %w", name, err)
	}
	out := make([][]float32, len(ms))
	for i, m := range ms {
		fm := m.(*fakeMemory)
		if err := fm.usable(); err != nil {
			return nil, fmt.Errorf("fake cublas: %s: %w", name, err)
		}
		out[i] = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(fm.a.b))), fm.Len()/4)
	}
	return out, nil
}

// Scale multiplies in float32.
func (b *Fake) Scale(m Memory, off, n int, alpha float32) error {
	v, err := b.fold("scale", m)
	if err != nil {
		return err
	}
	if off < 0 || n < 0 || off+n > len(v[0]) {
		return fmt.Errorf("fake cublas: scale of elements [%d, %d) of %d", off, off+n, len(v[0]))
	}
	for i := off; i < off+n; i++ {
		v[0][i] *= alpha
	}
	return nil
}

// Axpy multiplies and adds in float32, as cuBLAS may not fuse.
func (b *Fake) Axpy(dst, src Memory, off, n int, alpha float32) error {
	v, err := b.fold("axpy", dst, src)
	if err != nil {
		return err
	}
	if off < 0 || n < 0 || off+n > len(v[0]) || off+n > len(v[1]) {
		return fmt.Errorf("fake cublas: axpy of elements [%d, %d) of %d and %d", off, off+n, len(v[0]), len(v[1]))
	}
	for i := off; i < off+n; i++ {
		v[0][i] += alpha * v[1][i]
	}
	return nil
}

// CopyRange copies n float32 elements.
func (b *Fake) CopyRange(dst Memory, dstOff int, src Memory, srcOff, n int) error {
	v, err := b.fold("copy", dst, src)
	if err != nil {
		return err
	}
	if dstOff < 0 || srcOff < 0 || n < 0 || dstOff+n > len(v[0]) || srcOff+n > len(v[1]) {
		return fmt.Errorf("fake cuda: copy of %d elements from %d of %d to %d of %d", n, srcOff, len(v[1]), dstOff, len(v[0]))
	}
	copy(v[0][dstOff:dstOff+n], v[1][srcOff:srcOff+n])
	return nil
}

// Norm sums the squares in float64.
func (b *Fake) Norm(m Memory, off, n int) (float64, error) {
	v, err := b.fold("norm", m)
	if err != nil {
		return 0, err
	}
	if off < 0 || n < 0 || off+n > len(v[0]) {
		return 0, fmt.Errorf("fake cublas: norm of elements [%d, %d) of %d", off, off+n, len(v[0]))
	}
	var s float64
	for _, x := range v[0][off : off+n] {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s), nil
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

func (c *fakeComm) AllReduceSum(ctx context.Context, buf Memory, dt DType) error {
	return c.collective(ctx, "all-reduce", buf, func(bufs [][]byte) []byte { return sum(bufs, dt) })
}

func (c *fakeComm) Broadcast(ctx context.Context, buf Memory, dt DType, root int) error {
	if root < 0 || root >= c.g.n {
		return fmt.Errorf("fake nccl: broadcast root %d of %d ranks", root, c.g.n)
	}
	return c.collective(ctx, "broadcast", buf, func(bufs [][]byte) []byte { return bufs[root] })
}

// collective contributes buf to the group's next operation and waits for
// its result, which combine makes from every rank's buffer.
func (c *fakeComm) collective(ctx context.Context, name string, buf Memory, combine func([][]byte) []byte) error {
	fb := buf.(*fakeMemory)
	if c.isAborted() {
		return fmt.Errorf("fake nccl: %s: %w", name, ErrAborted)
	}
	if err := fb.usable(); err != nil {
		return fmt.Errorf("fake nccl: %s: %w", name, err)
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
		o.bufs[c.rank] = append([]byte(nil), fb.a.b[:fb.Len()]...)
		if o.arrived++; o.arrived == c.g.n {
			o.result = combine(o.bufs)
			delete(c.g.ops, c.seq)
			close(o.done)
		}
		c.b.f.mu.Unlock()
		done = o.done
	}
	var stop error // why the wait ended without the result
	abort := true  // this rank aborts its communicator with it
	select {
	case <-done:
	case <-c.aborted:
		stop, abort = ErrAborted, false
	case <-c.g.broken:
		stop = fmt.Errorf("%w: a peer aborted (%s)", ErrAborted, c.g.breakCause)
	case <-ctx.Done():
		stop = fmt.Errorf("%w: %w", ErrAborted, ctx.Err())
	}
	// A collective every rank completed has its result, as NCCL's has,
	// whatever ended the group a moment later: a peer that acted on the
	// same result first and aborted must not take it from this rank.
	select {
	case <-done:
		copy(fb.a.b[:fb.Len()], o.result)
		return nil
	default:
	}
	if abort {
		stop = errors.Join(stop, c.Abort())
	}
	return fmt.Errorf("fake nccl: %s: %w", name, stop)
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

// fakeMemory is an allocation as one rank holds it: its own (h set) or
// mapped from another's handle (opened, the first n bytes).
type fakeMemory struct {
	f      *Fabric
	a      *fakeAlloc
	h      IPCHandle
	opened bool
	n      int
	closed bool
}

func (m *fakeMemory) Len() int {
	if m.opened {
		return m.n
	}
	return len(m.a.b)
}

// usable fails for memory closed here, or freed by its owner.
func (m *fakeMemory) usable() error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	switch {
	case m.closed:
		return errors.New("device memory used after Close")
	case m.a.freed:
		return errors.New("mapped device memory its owner freed")
	}
	return nil
}

func (m *fakeMemory) Write(src []byte) error {
	if err := m.usable(); err != nil {
		return err
	}
	if len(src) > m.Len() {
		return fmt.Errorf("fake cuda: write of %d bytes into memory of %d", len(src), m.Len())
	}
	copy(m.a.b, src)
	return nil
}

func (m *fakeMemory) Read(dst []byte) error {
	if err := m.usable(); err != nil {
		return err
	}
	if len(dst) > m.Len() {
		return fmt.Errorf("fake cuda: read of %d bytes from memory of %d", len(dst), m.Len())
	}
	copy(dst, m.a.b)
	return nil
}

func (m *fakeMemory) Handle() (IPCHandle, error) {
	if m.opened {
		return IPCHandle{}, errors.New("fake cuda: mapped memory has no handle of its own")
	}
	return m.h, m.usable()
}

func (m *fakeMemory) Close() error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	if !m.opened {
		m.a.freed = true
		delete(m.f.mems, m.h)
	}
	return nil
}
