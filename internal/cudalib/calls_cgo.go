//go:build cgo

package cudalib

/*
#include <limits.h>
#include <stddef.h>

// NCCL's types, declared here so no header is needed. ncclUniqueId is 128
// opaque bytes passed by value; ncclComm_t, cudaStream_t and device
// pointers are opaque pointers; results and enums are ints.
typedef struct { char internal[128]; } cohort_nccl_id;

// The prefix of ncclConfig_t that NCCL 2.14 defined. NCCL copies the
// number of bytes `size` says and takes its defaults for every later
// field, so this prefix stays valid with newer libraries.
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
} cohort_nccl_config;

static int cohort_nccl_get_unique_id(void *fn, cohort_nccl_id *id) {
	return ((int (*)(cohort_nccl_id *))fn)(id);
}

// cohort_nccl_init_nonblocking asks for a non-blocking communicator, so
// the call returns at once (ncclInProgress) and a peer that never comes
// can be given up on with ncclCommAbort.
static int cohort_nccl_init_nonblocking(void *fn, void **comm, int nranks, cohort_nccl_id *id, int rank) {
	cohort_nccl_config c = {
		.size = sizeof(cohort_nccl_config),
		.magic = 0xcafebeef,
		.version = 21400, // NCCL_VERSION(2, 14, 0)
		.blocking = 0,
		.cgaClusterSize = INT_MIN, // NCCL_CONFIG_UNDEF_INT: NCCL's default
		.minCTAs = INT_MIN,
		.maxCTAs = INT_MIN,
		.netName = NULL,
	};
	return ((int (*)(void **, int, cohort_nccl_id, int, cohort_nccl_config *))fn)(comm, nranks, *id, rank, &c);
}

static int cohort_nccl_all_reduce(void *fn, void *buf, size_t count, int dtype, int op, void *comm, void *stream) {
	return ((int (*)(const void *, void *, size_t, int, int, void *, void *))fn)(buf, buf, count, dtype, op, comm, stream);
}

static int cohort_nccl_broadcast(void *fn, void *buf, size_t count, int dtype, int root, void *comm, void *stream) {
	return ((int (*)(const void *, void *, size_t, int, int, void *, void *))fn)(buf, buf, count, dtype, root, comm, stream);
}

static int cohort_nccl_async_error(void *fn, void *comm, int *result) {
	return ((int (*)(void *, int *))fn)(comm, result);
}

// cohort_call_ptr calls an `int f(void *)` entry point: ncclCommAbort,
// cudaFree, cudaStreamDestroy, cudaStreamQuery.
static int cohort_call_ptr(void *fn, void *p) {
	return ((int (*)(void *))fn)(p);
}

// cohort_call_ptr_out calls an `int f(void **out)` entry point:
// cudaStreamCreate.
static int cohort_call_ptr_out(void *fn, void **out) {
	return ((int (*)(void **))fn)(out);
}

static int cohort_call_int(void *fn, int v) {
	return ((int (*)(int))fn)(v);
}

static int cohort_cuda_malloc(void *fn, void **out, size_t n) {
	return ((int (*)(void **, size_t))fn)(out, n);
}

static int cohort_cuda_memcpy(void *fn, void *dst, const void *src, size_t n, int kind) {
	return ((int (*)(void *, const void *, size_t, int))fn)(dst, src, n, kind);
}

// cudaIpcMemHandle_t is 64 opaque bytes, passed by value to open.
typedef struct { char reserved[64]; } cohort_ipc_handle;

static int cohort_call_void(void *fn) {
	return ((int (*)(void))fn)();
}

static int cohort_cuda_pci_bus_id(void *fn, char *out, int len, int dev) {
	return ((int (*)(char *, int, int))fn)(out, len, dev);
}

static int cohort_cuda_ipc_get(void *fn, cohort_ipc_handle *h, void *p) {
	return ((int (*)(cohort_ipc_handle *, void *))fn)(h, p);
}

static int cohort_cuda_ipc_open(void *fn, void **out, cohort_ipc_handle *h, unsigned int flags) {
	return ((int (*)(void **, cohort_ipc_handle, unsigned int))fn)(out, *h, flags);
}

// cuBLAS with the default pointer mode: alpha is read from host memory.
static int cohort_cublas_sscal(void *fn, void *h, int n, float alpha, void *x) {
	return ((int (*)(void *, int, const float *, float *, int))fn)(h, n, &alpha, (float *)x, 1);
}

// Snrm2 writes its result to host memory in the default pointer mode and
// returns once it has.
static int cohort_cublas_snrm2(void *fn, void *h, int n, void *x, float *result) {
	return ((int (*)(void *, int, const float *, int, float *))fn)(h, n, (const float *)x, 1, result);
}

static int cohort_cublas_saxpy(void *fn, void *h, int n, float alpha, void *x, void *y) {
	return ((int (*)(void *, int, const float *, const float *, int, float *, int))fn)(h, n, &alpha, (const float *)x, 1, (float *)y, 1);
}
*/
import "C"

import "unsafe"

func ncclGetUniqueID(fn unsafe.Pointer) (id UniqueID, code int) {
	var cid C.cohort_nccl_id
	code = int(C.cohort_nccl_get_unique_id(fn, &cid))
	copy(id[:], C.GoBytes(unsafe.Pointer(&cid.internal[0]), C.int(len(id))))
	return id, code
}

func ncclInitNonBlocking(fn unsafe.Pointer, nranks int, id UniqueID, rank int) (unsafe.Pointer, int) {
	var cid C.cohort_nccl_id
	for i, b := range id {
		cid.internal[i] = C.char(b)
	}
	var comm unsafe.Pointer
	code := C.cohort_nccl_init_nonblocking(fn, &comm, C.int(nranks), &cid, C.int(rank))
	return comm, int(code)
}

func ncclAllReduce(fn, buf unsafe.Pointer, count int, dtype, op int, comm, stream unsafe.Pointer) int {
	return int(C.cohort_nccl_all_reduce(fn, buf, C.size_t(count), C.int(dtype), C.int(op), comm, stream))
}

func ncclBroadcast(fn, buf unsafe.Pointer, count int, dtype, root int, comm, stream unsafe.Pointer) int {
	return int(C.cohort_nccl_broadcast(fn, buf, C.size_t(count), C.int(dtype), C.int(root), comm, stream))
}

func ncclAsyncError(fn, comm unsafe.Pointer) (code, result int) {
	var r C.int
	code = int(C.cohort_nccl_async_error(fn, comm, &r))
	return code, int(r)
}

func callPtr(fn, p unsafe.Pointer) int { return int(C.cohort_call_ptr(fn, p)) }

func callPtrOut(fn unsafe.Pointer) (unsafe.Pointer, int) {
	var out unsafe.Pointer
	code := C.cohort_call_ptr_out(fn, &out)
	return out, int(code)
}

func callInt(fn unsafe.Pointer, v int) int { return int(C.cohort_call_int(fn, C.int(v))) }

func cudaMalloc(fn unsafe.Pointer, n int) (unsafe.Pointer, int) {
	var out unsafe.Pointer
	code := C.cohort_cuda_malloc(fn, &out, C.size_t(n))
	return out, int(code)
}

// cudaMemcpy copies n bytes; host memory is the caller's (a Go slice or
// the arena's mapping), pinned for the call's length by cgo's rules.
func cudaMemcpy(fn, dst, src unsafe.Pointer, n, kind int) int {
	return int(C.cohort_cuda_memcpy(fn, dst, src, C.size_t(n), C.int(kind)))
}

func callVoid(fn unsafe.Pointer) int { return int(C.cohort_call_void(fn)) }

func cudaPCIBusID(fn unsafe.Pointer, dev int) (string, int) {
	var buf [32]C.char
	code := C.cohort_cuda_pci_bus_id(fn, &buf[0], C.int(len(buf)), C.int(dev))
	if code != 0 {
		return "", int(code)
	}
	return C.GoString(&buf[0]), 0
}

func cudaIPCGet(fn, p unsafe.Pointer) (IPCHandle, int) {
	var h C.cohort_ipc_handle
	code := C.cohort_cuda_ipc_get(fn, &h, p)
	var out IPCHandle
	copy(out[:], C.GoBytes(unsafe.Pointer(&h.reserved[0]), C.int(len(out))))
	return out, int(code)
}

func cudaIPCOpen(fn unsafe.Pointer, h IPCHandle, flags uint) (unsafe.Pointer, int) {
	var ch C.cohort_ipc_handle
	for i, b := range h {
		ch.reserved[i] = C.char(b)
	}
	var out unsafe.Pointer
	code := C.cohort_cuda_ipc_open(fn, &out, &ch, C.uint(flags))
	return out, int(code)
}

func cublasSscal(fn, h unsafe.Pointer, n int, alpha float32, x unsafe.Pointer) int {
	return int(C.cohort_cublas_sscal(fn, h, C.int(n), C.float(alpha), x))
}

func cublasSaxpy(fn, h unsafe.Pointer, n int, alpha float32, x, y unsafe.Pointer) int {
	return int(C.cohort_cublas_saxpy(fn, h, C.int(n), C.float(alpha), x, y))
}

func cublasSnrm2(fn, h unsafe.Pointer, n int, x unsafe.Pointer) (float32, int) {
	var r C.float
	code := C.cohort_cublas_snrm2(fn, h, C.int(n), x, &r)
	return float32(r), int(code)
}
