package cudalib

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// UniqueID is NCCL's ncclUniqueId: where a communicator's ranks meet.
type UniqueID [128]byte

// Comm is an NCCL communicator (ncclComm_t).
type Comm struct{ p unsafe.Pointer }

// Stream is a CUDA stream (cudaStream_t).
type Stream struct{ p unsafe.Pointer }

// DevicePtr is device memory from Malloc or IPCOpen.
type DevicePtr struct{ p unsafe.Pointer }

// Add is the address off bytes past p.
func (p DevicePtr) Add(off int) DevicePtr { return DevicePtr{unsafe.Add(p.p, off)} }

// IPCHandle names device memory to other processes (cudaIpcMemHandle_t).
type IPCHandle [64]byte

// BLASHandle is a cuBLAS context (cublasHandle_t), bound to the device
// current when it was made.
type BLASHandle struct{ p unsafe.Pointer }

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
	cudaMemcpyDevice   = 3 // device to device
	// cudaIpcMemLazyEnablePeerAccess: map another device's memory with
	// peer access turned on as needed.
	cudaIpcLazyPeer = 1
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

// CopyOnDevice copies n bytes from src to dst, both device memory, and
// waits for the copy (cudaMemcpy does not wait for device to device).
func (r *Runtime) CopyOnDevice(dst, src DevicePtr, n int) error {
	if n == 0 {
		return nil
	}
	fn, err := r.l.sym("cudaMemcpy")
	if err != nil {
		return err
	}
	if err := r.check("cudaMemcpy on device", cudaMemcpy(fn, dst.p, src.p, n, cudaMemcpyDevice)); err != nil {
		return err
	}
	return r.Synchronize()
}

// Synchronize waits for all work on the current device
// (cudaDeviceSynchronize).
func (r *Runtime) Synchronize() error {
	fn, err := r.l.sym("cudaDeviceSynchronize")
	if err != nil {
		return err
	}
	return r.check("cudaDeviceSynchronize", callVoid(fn))
}

// PCIBusID is dev's PCI bus id ("0000:3b:00.0"), which names it the same
// in every process of the host whatever CUDA_VISIBLE_DEVICES says
// (cudaDeviceGetPCIBusId).
func (r *Runtime) PCIBusID(dev int) (string, error) {
	fn, err := r.l.sym("cudaDeviceGetPCIBusId")
	if err != nil {
		return "", err
	}
	id, code := cudaPCIBusID(fn, dev)
	return id, r.check(fmt.Sprintf("cudaDeviceGetPCIBusId(%d)", dev), code)
}

// IPCHandleOf names memory this process allocated with Malloc to other
// processes (cudaIpcGetMemHandle).
func (r *Runtime) IPCHandleOf(p DevicePtr) (IPCHandle, error) {
	fn, err := r.l.sym("cudaIpcGetMemHandle")
	if err != nil {
		return IPCHandle{}, err
	}
	h, code := cudaIPCGet(fn, p.p)
	return h, r.check("cudaIpcGetMemHandle", code)
}

// IPCOpen maps another process's memory on the current device
// (cudaIpcOpenMemHandle); IPCClose unmaps it. A handle of this process's
// own memory does not open.
func (r *Runtime) IPCOpen(h IPCHandle) (DevicePtr, error) {
	fn, err := r.l.sym("cudaIpcOpenMemHandle")
	if err != nil {
		return DevicePtr{}, err
	}
	p, code := cudaIPCOpen(fn, h, cudaIpcLazyPeer)
	return DevicePtr{p}, r.check("cudaIpcOpenMemHandle", code)
}

// IPCClose unmaps memory IPCOpen mapped.
func (r *Runtime) IPCClose(p DevicePtr) error {
	code, err := r.callPtr("cudaIpcCloseMemHandle", p.p)
	if err != nil {
		return err
	}
	return r.check("cudaIpcCloseMemHandle", code)
}

func (b *BLAS) check(name string, code int) error {
	if code == 0 {
		return nil
	}
	return &CallError{Func: name, Code: code, Message: blasStatus(code)}
}

// blasStatus names cublasStatus_t's codes; cublasGetStatusString is
// newer than some cuBLAS 12 builds.
func blasStatus(code int) string {
	switch code {
	case 1:
		return "CUBLAS_STATUS_NOT_INITIALIZED"
	case 3:
		return "CUBLAS_STATUS_ALLOC_FAILED"
	case 7:
		return "CUBLAS_STATUS_INVALID_VALUE"
	case 8:
		return "CUBLAS_STATUS_ARCH_MISMATCH"
	case 11:
		return "CUBLAS_STATUS_MAPPING_ERROR"
	case 13:
		return "CUBLAS_STATUS_EXECUTION_FAILED"
	case 14:
		return "CUBLAS_STATUS_INTERNAL_ERROR"
	case 15:
		return "CUBLAS_STATUS_NOT_SUPPORTED"
	}
	return fmt.Sprintf("cublasStatus_t %d", code)
}

// Create makes a cuBLAS context on the current device (cublasCreate).
func (b *BLAS) Create() (BLASHandle, error) {
	fn, err := b.l.sym("cublasCreate_v2")
	if err != nil {
		return BLASHandle{}, err
	}
	p, code := callPtrOut(fn)
	return BLASHandle{p}, b.check("cublasCreate", code)
}

// Destroy releases h (cublasDestroy).
func (b *BLAS) Destroy(h BLASHandle) error {
	fn, err := b.l.sym("cublasDestroy_v2")
	if err != nil {
		return err
	}
	return b.check("cublasDestroy", callPtr(fn, h.p))
}

// blasChunk bounds one call's elements: cuBLAS counts in int.
const blasChunk = 1 << 30

// Scale multiplies n float32 values at x by alpha, in place
// (cublasSscal), on h's device; the work is queued, not waited for.
func (b *BLAS) Scale(h BLASHandle, n int, alpha float32, x DevicePtr) error {
	fn, err := b.l.sym("cublasSscal_v2")
	if err != nil {
		return err
	}
	for off := 0; off < n; off += blasChunk {
		if err := b.check("cublasSscal", cublasSscal(fn, h.p, min(blasChunk, n-off), alpha, x.Add(4*off).p)); err != nil {
			return err
		}
	}
	return nil
}

// Axpy adds alpha times n float32 values at x to those at y
// (cublasSaxpy), on h's device; the work is queued, not waited for.
func (b *BLAS) Axpy(h BLASHandle, n int, alpha float32, x, y DevicePtr) error {
	fn, err := b.l.sym("cublasSaxpy_v2")
	if err != nil {
		return err
	}
	for off := 0; off < n; off += blasChunk {
		if err := b.check("cublasSaxpy", cublasSaxpy(fn, h.p, min(blasChunk, n-off), alpha, x.Add(4*off).p, y.Add(4*off).p)); err != nil {
			return err
		}
	}
	return nil
}

// Norm is the L2 norm of n float32 values at x (cublasSnrm2), waited for.
func (b *BLAS) Norm(h BLASHandle, n int, x DevicePtr) (float64, error) {
	fn, err := b.l.sym("cublasSnrm2_v2")
	if err != nil {
		return 0, err
	}
	var sq float64
	for off := 0; off < n; off += blasChunk {
		r, code := cublasSnrm2(fn, h.p, min(blasChunk, n-off), x.Add(4*off).p)
		if err := b.check("cublasSnrm2", code); err != nil {
			return 0, err
		}
		sq += float64(r) * float64(r)
	}
	return math.Sqrt(sq), nil
}

// bootID names this boot of this host: with a PCI bus id it names a GPU
// across the cohort's hosts, and containers sharing a kernel share it as
// they share its GPUs.
var bootID = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("the host's boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
})

// GPUName names dev the same in every process that sees it and
// differently from every other GPU of the cohort: the host's boot id, "/",
// and the GPU's PCI bus id.
func (r *Runtime) GPUName(dev int) (string, error) {
	boot, err := bootID()
	if err != nil {
		return "", err
	}
	var bus string
	err = r.OnDevice(dev, func() error {
		var err error
		bus, err = r.PCIBusID(dev)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("device %d: %w", dev, err)
	}
	return boot + "/" + bus, nil
}

// Pointer is p's address, to hand to a library that takes device memory.
func (p DevicePtr) Pointer() unsafe.Pointer { return p.p }
