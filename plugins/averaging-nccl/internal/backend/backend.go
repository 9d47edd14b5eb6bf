// Package backend is what the NCCL averager needs of CUDA and NCCL, as an
// interface: device count, a communicator's unique id, a communicator
// built with a deadline, in-place all-reduce (sum) and broadcast on a
// device buffer, and abort. NCCL is the implementation over the libraries
// cudalib loads; Fabric makes in-process fakes for tests on machines
// without a GPU.
package backend

import (
	"context"
	"errors"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/cudalib"
)

// UniqueID is where a communicator's ranks meet (NCCL's ncclUniqueId).
type UniqueID = cudalib.UniqueID

// DType is a buffer's element type.
type DType int

// The element types collectives run on.
const (
	Float32 DType = iota
	Float64
)

// Size is the bytes of one element.
func (d DType) Size() int {
	if d == Float64 {
		return 8
	}
	return 4
}

// ErrAborted is wrapped by the error of an operation on a communicator
// that was aborted, by this rank or because its context ended.
var ErrAborted = errors.New("communicator aborted")

// Backend is one rank's view of its GPUs and NCCL. Its methods are safe
// for concurrent use.
type Backend interface {
	// DeviceCount is how many GPUs this process sees; a host without one
	// is an error saying why.
	DeviceCount() (int, error)
	// NewUniqueID makes the id a new communicator's ranks meet at. The
	// process that made it must live until they have met.
	NewUniqueID() (UniqueID, error)
	// InitComm builds rank's member of an nranks communicator on device,
	// meeting at id. It returns once every rank has joined; when ctx ends
	// first, the half-built communicator is aborted and the error wraps
	// ErrAborted and ctx's error.
	InitComm(ctx context.Context, id UniqueID, nranks, rank, device int) (Comm, error)
	// Close releases the libraries; every Comm must be aborted first.
	Close() error
}

// Comm is one rank's member of a communicator. Its collectives wait for
// the other ranks: when ctx ends first, or the communicator reports an
// asynchronous error (a peer gone), it is aborted and the error wraps
// ErrAborted. An aborted Comm fails every later call. Calls must not
// overlap, except Abort, which may come from any goroutine.
type Comm interface {
	// Alloc is a device buffer of n bytes on the communicator's device.
	Alloc(n int) (Buffer, error)
	// AllReduceSum sums buf elementwise over the ranks, in place.
	AllReduceSum(ctx context.Context, buf Buffer, dt DType) error
	// Broadcast copies root's buf into every rank's, in place.
	Broadcast(ctx context.Context, buf Buffer, dt DType, root int) error
	// Abort ends the communicator without waiting for peers or pending
	// work, and frees its buffers. It is idempotent.
	Abort() error
}

// Buffer is device memory of a Comm, freed when the Comm is aborted.
type Buffer interface {
	Len() int
	// Write copies src (at most Len bytes) to the buffer's start.
	Write(src []byte) error
	// Read copies the buffer's first len(dst) bytes into dst.
	Read(dst []byte) error
}
