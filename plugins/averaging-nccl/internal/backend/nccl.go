package backend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/cudalib"
)

// NCCL is the Backend over the libraries cudalib loads.
type NCCL struct {
	libs *cudalib.Libraries
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
	return &NCCL{libs: libs}, nil
}

// DeviceCount asks the CUDA runtime.
func (b *NCCL) DeviceCount() (int, error) { return b.libs.Runtime.DeviceCount() }

// NewUniqueID calls ncclGetUniqueId.
func (b *NCCL) NewUniqueID() (UniqueID, error) { return b.libs.NCCL.GetUniqueID() }

// Close unloads the libraries.
func (b *NCCL) Close() error { return b.libs.Close() }

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
	bufs   []cudalib.DevicePtr
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

func (c *ncclComm) Alloc(n int) (Buffer, error) {
	var p cudalib.DevicePtr
	err := c.do(func() error {
		var err error
		p, err = c.rt.Malloc(n)
		if err == nil {
			c.bufs = append(c.bufs, p)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nccl: device %d: %w", c.device, err)
	}
	return &ncclBuffer{c: c, p: p, n: n}, nil
}

func (c *ncclComm) AllReduceSum(ctx context.Context, buf Buffer, dt DType) error {
	b := buf.(*ncclBuffer)
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

func (c *ncclComm) Broadcast(ctx context.Context, buf Buffer, dt DType, root int) error {
	b := buf.(*ncclBuffer)
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
// still waiting for a peer, then frees the buffers and the stream.
func (c *ncclComm) Abort() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return nil
	}
	c.live = false
	return c.rt.OnDevice(c.device, func() error {
		errs := []error{c.nccl.Abort(c.comm)}
		for _, p := range c.bufs {
			errs = append(errs, c.rt.Free(p))
		}
		c.bufs = nil
		return errors.Join(append(errs, c.rt.StreamDestroy(c.stream))...)
	})
}

func ncclType(dt DType) cudalib.DataType {
	if dt == Float64 {
		return cudalib.Float64
	}
	return cudalib.Float32
}

type ncclBuffer struct {
	c *ncclComm
	p cudalib.DevicePtr
	n int
}

func (b *ncclBuffer) Len() int { return b.n }

func (b *ncclBuffer) Write(src []byte) error {
	if len(src) > b.n {
		return fmt.Errorf("nccl: write of %d bytes into a buffer of %d", len(src), b.n)
	}
	return b.c.do(func() error { return b.c.rt.CopyToDevice(b.p, src) })
}

func (b *ncclBuffer) Read(dst []byte) error {
	if len(dst) > b.n {
		return fmt.Errorf("nccl: read of %d bytes from a buffer of %d", len(dst), b.n)
	}
	return b.c.do(func() error { return b.c.rt.CopyToHost(dst, b.p) })
}
