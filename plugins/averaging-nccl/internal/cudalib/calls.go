package cudalib

import (
	"fmt"
	"runtime"
	"unsafe"
)

// UniqueID is NCCL's ncclUniqueId: where a communicator's ranks meet.
type UniqueID [128]byte

// Comm is an NCCL communicator (ncclComm_t).
type Comm struct{ p unsafe.Pointer }

// Stream is a CUDA stream (cudaStream_t).
type Stream struct{ p unsafe.Pointer }

// DevicePtr is device memory from Malloc.
type DevicePtr struct{ p unsafe.Pointer }

// DataType is NCCL's ncclDataType_t.
type DataType int

// The element types the averager reduces.
const (
	Float32 DataType = 7 // ncclFloat32
	Float64 DataType = 8 // ncclFloat64
)

// NCCL and CUDA result codes the callers tell apart.
const (
	ncclSuccess        = 0
	ncclInProgress     = 7
	cudaErrorNotReady  = 600
	ncclSum            = 0
	cudaMemcpyToDevice = 1
	cudaMemcpyToHost   = 2
)

func (n *NCCL) check(name string, code int) error {
	if code == ncclSuccess {
		return nil
	}
	return &CallError{Func: name, Code: code, Message: callErrorString(n.l.syms["ncclGetErrorString"], code)}
}

// NonBlockingInit reports whether the library has ncclCommInitRankConfig
// (NCCL 2.14+), which InitNonBlocking needs.
func (n *NCCL) NonBlockingInit() bool { return n.l.syms["ncclCommInitRankConfig"] != nil }

// GetUniqueID makes a fresh id (ncclGetUniqueId); the calling process
// hosts the communicator's bootstrap until the communicator is built.
func (n *NCCL) GetUniqueID() (UniqueID, error) {
	fn, err := n.l.sym("ncclGetUniqueId")
	if err != nil {
		return UniqueID{}, err
	}
	id, code := ncclGetUniqueID(fn)
	return id, n.check("ncclGetUniqueId", code)
}

// InitNonBlocking starts building rank's communicator of nranks on the
// calling thread's current device (ncclCommInitRankConfig with blocking
// off). It returns at once; AsyncError says when the build is done.
func (n *NCCL) InitNonBlocking(nranks int, id UniqueID, rank int) (Comm, error) {
	if !n.NonBlockingInit() {
		return Comm{}, fmt.Errorf("%s lacks ncclCommInitRankConfig (NCCL 2.14+), without which a communicator whose peer never comes cannot be given up on", n.l.from.Path)
	}
	fn, err := n.l.sym("ncclCommInitRankConfig")
	if err != nil {
		return Comm{}, err
	}
	p, code := ncclInitNonBlocking(fn, nranks, id, rank)
	if code == ncclInProgress {
		code = ncclSuccess
	}
	return Comm{p}, n.check("ncclCommInitRankConfig", code)
}

// AsyncError is the communicator's state (ncclCommGetAsyncError): done
// false while an operation is still in progress, err its failure.
func (n *NCCL) AsyncError(c Comm) (done bool, err error) {
	fn, err := n.l.sym("ncclCommGetAsyncError")
	if err != nil {
		return false, err
	}
	code, result := ncclAsyncError(fn, c.p)
	if err := n.check("ncclCommGetAsyncError", code); err != nil {
		return false, err
	}
	if result == ncclInProgress {
		return false, nil
	}
	return true, n.check("asynchronous error", result)
}

// AllReduceSum enqueues an in-place sum of count elements of buf on
// stream (ncclAllReduce).
func (n *NCCL) AllReduceSum(c Comm, buf DevicePtr, count int, dt DataType, s Stream) error {
	fn, err := n.l.sym("ncclAllReduce")
	if err != nil {
		return err
	}
	code := ncclAllReduce(fn, buf.p, count, int(dt), ncclSum, c.p, s.p)
	if code == ncclInProgress {
		code = ncclSuccess
	}
	return n.check("ncclAllReduce", code)
}

// Broadcast enqueues an in-place broadcast of count elements of buf from
// root on stream (ncclBroadcast).
func (n *NCCL) Broadcast(c Comm, buf DevicePtr, count int, dt DataType, root int, s Stream) error {
	fn, err := n.l.sym("ncclBroadcast")
	if err != nil {
		return err
	}
	code := ncclBroadcast(fn, buf.p, count, int(dt), root, c.p, s.p)
	if code == ncclInProgress {
		code = ncclSuccess
	}
	return n.check("ncclBroadcast", code)
}

// Abort ends the communicator without waiting for its peers or its
// operations (ncclCommAbort) and frees it.
func (n *NCCL) Abort(c Comm) error {
	fn, err := n.l.sym("ncclCommAbort")
	if err != nil {
		return err
	}
	return n.check("ncclCommAbort", callPtr(fn, c.p))
}

func (r *Runtime) check(name string, code int) error {
	if code == 0 {
		return nil
	}
	return &CallError{Func: name, Code: code, Message: callErrorString(r.l.syms["cudaGetErrorString"], code)}
}

func (r *Runtime) callPtr(name string, p unsafe.Pointer) (int, error) {
	fn, err := r.l.sym(name)
	if err != nil {
		return 0, err
	}
	return callPtr(fn, p), nil
}

// OnDevice runs f on an OS thread whose current device is dev: the CUDA
// runtime keeps the current device per thread, and a goroutine may change
// threads between two cgo calls.
func (r *Runtime) OnDevice(dev int, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fn, err := r.l.sym("cudaSetDevice")
	if err != nil {
		return err
	}
	if err := r.check(fmt.Sprintf("cudaSetDevice(%d)", dev), callInt(fn, dev)); err != nil {
		return err
	}
	return f()
}

// StreamCreate makes a stream on the current device.
func (r *Runtime) StreamCreate() (Stream, error) {
	fn, err := r.l.sym("cudaStreamCreate")
	if err != nil {
		return Stream{}, err
	}
	p, code := callPtrOut(fn)
	return Stream{p}, r.check("cudaStreamCreate", code)
}

// StreamDestroy releases s once its work is done.
func (r *Runtime) StreamDestroy(s Stream) error {
	code, err := r.callPtr("cudaStreamDestroy", s.p)
	if err != nil {
		return err
	}
	return r.check("cudaStreamDestroy", code)
}

// StreamDone reports whether all of s's work has finished
// (cudaStreamQuery), without waiting.
func (r *Runtime) StreamDone(s Stream) (bool, error) {
	code, err := r.callPtr("cudaStreamQuery", s.p)
	if err != nil || code == cudaErrorNotReady {
		return false, err
	}
	return true, r.check("cudaStreamQuery", code)
}

// Malloc allocates n bytes on the current device.
func (r *Runtime) Malloc(n int) (DevicePtr, error) {
	fn, err := r.l.sym("cudaMalloc")
	if err != nil {
		return DevicePtr{}, err
	}
	p, code := cudaMalloc(fn, n)
	return DevicePtr{p}, r.check(fmt.Sprintf("cudaMalloc(%d)", n), code)
}

// Free releases memory from Malloc.
func (r *Runtime) Free(p DevicePtr) error {
	code, err := r.callPtr("cudaFree", p.p)
	if err != nil {
		return err
	}
	return r.check("cudaFree", code)
}

// CopyToDevice copies src into dst, waiting for the copy.
func (r *Runtime) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	fn, err := r.l.sym("cudaMemcpy")
	if err != nil {
		return err
	}
	return r.check("cudaMemcpy to device", cudaMemcpy(fn, dst.p, unsafe.Pointer(&src[0]), len(src), cudaMemcpyToDevice))
}

// CopyToHost copies len(dst) bytes of src into dst, waiting for the copy.
func (r *Runtime) CopyToHost(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	fn, err := r.l.sym("cudaMemcpy")
	if err != nil {
		return err
	}
	return r.check("cudaMemcpy to host", cudaMemcpy(fn, unsafe.Pointer(&dst[0]), src.p, len(dst), cudaMemcpyToHost))
}
