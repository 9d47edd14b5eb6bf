// Package backend is what the NCCL averager needs of CUDA, cuBLAS and
// NCCL, as an interface: the GPUs and their names across processes,
// device memory that other processes of the host can map (CUDA IPC), the
// scale-and-add that folds the ranks sharing a GPU, and communicators
// built with a deadline, with in-place all-reduce (sum) and broadcast, and
// abort. NCCL is the implementation over the libraries cudalib loads;
// Fabric makes in-process fakes for tests on machines without a GPU.
package backend

import (
	"context"
	"errors"

	"github.com/cohortdl/cohort/internal/cudalib"
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

// IPCHandle names device memory to the other processes of its host.
type IPCHandle = cudalib.IPCHandle

// Backend is one rank's view of its GPUs and NCCL. Its methods are safe
// for concurrent use.
type Backend interface {
	// DeviceCount is how many GPUs this process sees; a host without one
	// is an error saying why.
	DeviceCount() (int, error)
	// DeviceID names device the same in every process that sees it and
	// differently from every other GPU of the cohort (its host's boot and
	// its PCI bus): ranks with equal ids share the GPU.
	DeviceID(device int) (string, error)
	// Alloc is n bytes of device memory on device.
	Alloc(device, n int) (Memory, error)
	// Open maps another process's n bytes of device memory on device from
	// its handle.
	Open(device int, h IPCHandle, n int) (Memory, error)
	// Scale multiplies the float32 elements [off, off+n) of m by alpha;
	// Axpy adds alpha times src's elements [off, off+n) to dst's. Both
	// are done when they return.
	Scale(m Memory, off, n int, alpha float32) error
	Axpy(dst, src Memory, off, n int, alpha float32) error
	// CopyRange copies n float32 elements from src's srcOff to dst's
	// dstOff, device to device.
	CopyRange(dst Memory, dstOff int, src Memory, srcOff, n int) error
	// Norm is the L2 norm of m's float32 elements [off, off+n).
	Norm(m Memory, off, n int) (float64, error)
	// NewUniqueID makes the id a new communicator's ranks meet at. The
	// process that made it must live until they have met.
	NewUniqueID() (UniqueID, error)
	// InitComm builds rank's member of an nranks communicator on device,
	// meeting at id. It returns once every rank has joined; when ctx ends
	// first, the half-built communicator is aborted and the error wraps
	// ErrAborted and ctx's error.
	InitComm(ctx context.Context, id UniqueID, nranks, rank, device int) (Comm, error)
	// Close releases the libraries; every Comm must be aborted and every
	// Memory closed first.
	Close() error
}

// Comm is one rank's member of a communicator. Its collectives wait for
// the other ranks: when ctx ends first, or the communicator reports an
// asynchronous error (a peer gone), it is aborted and the error wraps
// ErrAborted. An aborted Comm fails every later call. Calls must not
// overlap, except Abort, which may come from any goroutine.
type Comm interface {
	// AllReduceSum sums m elementwise over the ranks, in place.
	AllReduceSum(ctx context.Context, m Memory, dt DType) error
	// Broadcast copies root's m into every rank's, in place.
	Broadcast(ctx context.Context, m Memory, dt DType, root int) error
	// Abort ends the communicator without waiting for peers or pending
	// work. It is idempotent.
	Abort() error
}

// Memory is device memory: this process's (Alloc), which Handle names to
// the host's other processes, or another process's (Open).
type Memory interface {
	Len() int
	// Write copies src (at most Len bytes) to the memory's start.
	Write(src []byte) error
	// Read copies the memory's first len(dst) bytes into dst.
	Read(dst []byte) error
	// Handle names memory from Alloc to other processes.
	Handle() (IPCHandle, error)
	// Close frees memory from Alloc (mappings of it elsewhere go stale)
	// or unmaps memory from Open. Idempotent.
	Close() error
}
