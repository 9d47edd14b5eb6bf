package backend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cohortdl/cohort/internal/cudalib"
)

// NCCL is the Backend over the libraries cudalib loads.
type NCCL struct {
	libs *cudalib.Libraries
	opts cudalib.Options

	// mu guards cuBLAS, loaded when a fold first needs it, and its
	// contexts, one per device.
	mu      sync.Mutex
	blas    *cudalib.BLAS
	handles map[int]cudalib.BLASHandle
}

// OpenNCCL loads NCCL and the CUDA runtime from the places o adds to the
// host's usual ones. On a host without them it fails at once with
// cudalib's error, which names every file and place tried.
func OpenNCCL(o cudalib.Options) (*NCCL, error) {
	libs, err := cudalib.Load(o)
	if err != nil {
		return nil, err
	}
	if !libs.NCCL.NonBlockingInit() {
		v, _ := libs.NCCL.Version()
		return nil, errors.Join(fmt.Errorf("NCCL %v from %s is older than 2.14: the averager needs ncclCommInitRankConfig, so that building a communicator whose peer never comes can be given up on", v, libs.NCCL.Source().Path), libs.Close())
	}
	return &NCCL{libs: libs, opts: o, handles: map[int]cudalib.BLASHandle{}}, nil
}

// DeviceCount asks the CUDA runtime.
func (b *NCCL) DeviceCount() (int, error) { return b.libs.Runtime.DeviceCount() }

// NewUniqueID calls ncclGetUniqueId.
func (b *NCCL) NewUniqueID() (UniqueID, error) { return b.libs.NCCL.GetUniqueID() }

// Close releases cuBLAS's contexts and unloads the libraries.
func (b *NCCL) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for dev, h := range b.handles {
		errs = append(errs, b.libs.Runtime.OnDevice(dev, func() error { return b.blas.Destroy(h) }))
	}
	b.handles = map[int]cudalib.BLASHandle{}
	if b.blas != nil {
		errs = append(errs, b.blas.Close())
		b.blas = nil
	}
	return errors.Join(append(errs, b.libs.Close())...)
}

// DeviceID is the device's GPUName: the host's boot id and its PCI bus id.
func (b *NCCL) DeviceID(device int) (string, error) { return b.libs.Runtime.GPUName(device) }

// Alloc calls cudaMalloc on device.
func (b *NCCL) Alloc(device, n int) (Memory, error) {
	m := &ncclMemory{rt: b.libs.Runtime, device: device, n: n}
	err := b.libs.Runtime.OnDevice(device, func() error {
		var err error
		m.p, err = b.libs.Runtime.Malloc(max(n, 4))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("device %d: %w", device, err)
	}
	return m, nil
}

// Open calls cudaIpcOpenMemHandle on device.
func (b *NCCL) Open(device int, h IPCHandle, n int) (Memory, error) {
	m := &ncclMemory{rt: b.libs.Runtime, device: device, n: n, opened: true}
	err := b.libs.Runtime.OnDevice(device, func() error {
		var err error
		m.p, err = b.libs.Runtime.IPCOpen(h)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("device %d: map another rank's memory: %w", device, err)
	}
	return m, nil
}

// onBLAS runs f with device's cuBLAS context as the current device's,
// loading cuBLAS and making the context the first time, and waits for the
// device's work.
func (b *NCCL) onBLAS(device int, f func(*cudalib.BLAS, cudalib.BLASHandle) error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.blas == nil {
		l, err := cudalib.OpenBLAS(b.opts)
		if err != nil {
			return fmt.Errorf("ranks sharing a GPU fold with cuBLAS: %w", err)
		}
		b.blas = l
	}
	return b.libs.Runtime.OnDevice(device, func() error {
		h, ok := b.handles[device]
		if !ok {
			var err error
			if h, err = b.blas.Create(); err != nil {
				return err
			}
			b.handles[device] = h
		}
		if err := f(b.blas, h); err != nil {
			return err
		}
		return b.libs.Runtime.Synchronize()
	})
}

// span checks that elements [off, off+n) lie in m.
func span(m *ncclMemory, off, n int) error {
	if off < 0 || n < 0 || 4*(off+n) > m.n {
		return fmt.Errorf("elements [%d, %d) of device memory of %d bytes", off, off+n, m.n)
	}
	return nil
}

// Scale calls cublasSscal.
func (b *NCCL) Scale(m Memory, off, n int, alpha float32) error {
	x := m.(*ncclMemory)
	if err := span(x, off, n); err != nil || n == 0 {
		return err
	}
	return b.onBLAS(x.device, func(l *cudalib.BLAS, h cudalib.BLASHandle) error {
		return l.Scale(h, n, alpha, x.p.Add(4*off))
	})
}

// Axpy calls cublasSaxpy.
func (b *NCCL) Axpy(dst, src Memory, off, n int, alpha float32) error {
	y, x := dst.(*ncclMemory), src.(*ncclMemory)
	if err := errors.Join(span(y, off, n), span(x, off, n)); err != nil || n == 0 {
		return err
	}
	return b.onBLAS(y.device, func(l *cudalib.BLAS, h cudalib.BLASHandle) error {
		return l.Axpy(h, n, alpha, x.p.Add(4*off), y.p.Add(4*off))
	})
}

// CopyRange calls cudaMemcpy, device to device, and waits for it.
func (b *NCCL) CopyRange(dst Memory, dstOff int, src Memory, srcOff, n int) error {
	d, s := dst.(*ncclMemory), src.(*ncclMemory)
	if err := errors.Join(span(d, dstOff, n), span(s, srcOff, n)); err != nil || n == 0 {
		return err
	}
	return b.libs.Runtime.OnDevice(d.device, func() error {
		return b.libs.Runtime.CopyOnDevice(d.p.Add(4*dstOff), s.p.Add(4*srcOff), 4*n)
	})
}

// Norm calls cublasSnrm2.
func (b *NCCL) Norm(m Memory, off, n int) (float64, error) {
	x := m.(*ncclMemory)
	if err := span(x, off, n); err != nil || n == 0 {
		return 0, err
	}
	var r float64
	err := b.onBLAS(x.device, func(l *cudalib.BLAS, h cudalib.BLASHandle) error {
		var err error
		r, err = l.Norm(h, n, x.p.Add(4*off))
		return err
	})
	return r, err
}

// pollInterval is how often a wait asks NCCL and the stream how they are:
// short next to a round, long enough not to spin a core.
const pollInterval = 200 * time.Microsecond

// InitComm builds a non-blocking communicator on device, with a stream of
// its own, and polls ncclCommGetAsyncError until it is ready, failed, or
// ctx ends (then ncclCommAbort).
func (b *NCCL) InitComm(ctx context.Context, id UniqueID, nranks, rank, device int) (Comm, error) {
	c := &ncclComm{rt: b.libs.Runtime, nccl: b.libs.NCCL, device: device}
	err := c.rt.OnDevice(device, func() error {
		s, err := c.rt.StreamCreate()
		if err != nil {
			return err
		}
		c.stream = s
		comm, err := c.nccl.InitNonBlocking(nranks, id, rank)
		if err != nil {
			return errors.Join(err, c.rt.StreamDestroy(s))
		}
		c.comm, c.live = comm, true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("nccl: init rank %d of %d on device %d: %w", rank, nranks, device, err)
	}
	if err := c.wait(ctx, false); err != nil {
		return nil, fmt.Errorf("nccl: init rank %d of %d on device %d: %w", rank, nranks, device, err)
	}
	return c, nil
}

type ncclComm struct {
	rt     *cudalib.Runtime
	nccl   *cudalib.NCCL
	device int

	// mu keeps Abort from freeing the communicator under a call on it.
	mu     sync.Mutex
	live   bool
	comm   cudalib.Comm
	stream cudalib.Stream
}

// do runs f on the device unless the communicator was aborted.
func (c *ncclComm) do(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return ErrAborted
	}
	return c.rt.OnDevice(c.device, f)
}

// wait polls until the communicator has no operation in progress (and,
// with stream, the stream's work is done), aborting it on an asynchronous
// error or when ctx ends.
func (c *ncclComm) wait(ctx context.Context, stream bool) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		var done bool
		err := c.do(func() error {
			var err error
			if done, err = c.nccl.AsyncError(c.comm); err != nil || !done || !stream {
				return err
			}
			done, err = c.rt.StreamDone(c.stream)
			return err
		})
		switch {
		case errors.Is(err, ErrAborted):
			return err
		case err != nil:
			return errors.Join(fmt.Errorf("%w: %w", ErrAborted, err), c.Abort())
		case done:
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%w: %w", ErrAborted, ctx.Err()), c.Abort())
		case <-t.C:
		}
	}
}

func (c *ncclComm) AllReduceSum(ctx context.Context, m Memory, dt DType) error {
	b := m.(*ncclMemory)
	if err := c.do(func() error {
		return c.nccl.AllReduceSum(c.comm, b.p, b.n/dt.Size(), ncclType(dt), c.stream)
	}); err != nil {
		return fmt.Errorf("nccl: all-reduce: %w", err)
	}
	if err := c.wait(ctx, true); err != nil {
		return fmt.Errorf("nccl: all-reduce: %w", err)
	}
	return nil
}

func (c *ncclComm) Broadcast(ctx context.Context, m Memory, dt DType, root int) error {
	b := m.(*ncclMemory)
	if err := c.do(func() error {
		return c.nccl.Broadcast(c.comm, b.p, b.n/dt.Size(), ncclType(dt), root, c.stream)
	}); err != nil {
		return fmt.Errorf("nccl: broadcast from %d: %w", root, err)
	}
	if err := c.wait(ctx, true); err != nil {
		return fmt.Errorf("nccl: broadcast from %d: %w", root, err)
	}
	return nil
}

// Abort calls ncclCommAbort, which ends any kernel of the communicator
// still waiting for a peer, then frees the stream.
func (c *ncclComm) Abort() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return nil
	}
	c.live = false
	return c.rt.OnDevice(c.device, func() error {
		return errors.Join(c.nccl.Abort(c.comm), c.rt.StreamDestroy(c.stream))
	})
}

func ncclType(dt DType) cudalib.DataType {
	if dt == Float64 {
		return cudalib.Float64
	}
	return cudalib.Float32
}

// ncclMemory is device memory this process allocated or mapped.
type ncclMemory struct {
	rt     *cudalib.Runtime
	device int
	p      cudalib.DevicePtr
	n      int
	opened bool // mapped from another process's handle

	mu     sync.Mutex
	closed bool
}

func (m *ncclMemory) Len() int { return m.n }

// do runs f on the memory's device unless it was closed.
func (m *ncclMemory) do(f func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("device memory used after Close")
	}
	return m.rt.OnDevice(m.device, f)
}

func (m *ncclMemory) Write(src []byte) error {
	if len(src) > m.n {
		return fmt.Errorf("write of %d bytes into device memory of %d", len(src), m.n)
	}
	return m.do(func() error { return m.rt.CopyToDevice(m.p, src) })
}

func (m *ncclMemory) Read(dst []byte) error {
	if len(dst) > m.n {
		return fmt.Errorf("read of %d bytes from device memory of %d", len(dst), m.n)
	}
	return m.do(func() error { return m.rt.CopyToHost(dst, m.p) })
}

func (m *ncclMemory) Handle() (IPCHandle, error) {
	if m.opened {
		return IPCHandle{}, errors.New("memory mapped from another process has no handle of its own")
	}
	var h IPCHandle
	err := m.do(func() error {
		var err error
		h, err = m.rt.IPCHandleOf(m.p)
		return err
	})
	return h, err
}

func (m *ncclMemory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	return m.rt.OnDevice(m.device, func() error {
		if m.opened {
			return m.rt.IPCClose(m.p)
		}
		return m.rt.Free(m.p)
	})
}
