//go:build !cgo

package cudalib

import "unsafe"

// Without cgo no library ever loads (dlOpen fails), so these are never
// reached; they keep the package building with CGO_ENABLED=0.

func ncclGetUniqueID(unsafe.Pointer) (UniqueID, int) { return UniqueID{}, -1 }

func ncclInitNonBlocking(unsafe.Pointer, int, UniqueID, int) (unsafe.Pointer, int) { return nil, -1 }

func ncclAllReduce(unsafe.Pointer, unsafe.Pointer, int, int, int, unsafe.Pointer, unsafe.Pointer) int {
	return -1
}

func ncclBroadcast(unsafe.Pointer, unsafe.Pointer, int, int, int, unsafe.Pointer, unsafe.Pointer) int {
	return -1
}

func ncclAsyncError(unsafe.Pointer, unsafe.Pointer) (code, result int) { return -1, 0 }

func callPtr(unsafe.Pointer, unsafe.Pointer) int { return -1 }

func callPtrOut(unsafe.Pointer) (unsafe.Pointer, int) { return nil, -1 }

func callInt(unsafe.Pointer, int) int { return -1 }

func cudaMalloc(unsafe.Pointer, int) (unsafe.Pointer, int) { return nil, -1 }

func cudaMemcpy(unsafe.Pointer, unsafe.Pointer, unsafe.Pointer, int, int) int { return -1 }

func callVoid(unsafe.Pointer) int { return -1 }

func cudaPCIBusID(unsafe.Pointer, int) (string, int) { return "", -1 }

func cudaIPCGet(unsafe.Pointer, unsafe.Pointer) (IPCHandle, int) { return IPCHandle{}, -1 }

func cudaIPCOpen(unsafe.Pointer, IPCHandle, uint) (unsafe.Pointer, int) { return nil, -1 }

func cublasSscal(unsafe.Pointer, unsafe.Pointer, int, float32, unsafe.Pointer) int { return -1 }

func cublasSaxpy(unsafe.Pointer, unsafe.Pointer, int, float32, unsafe.Pointer, unsafe.Pointer) int {
	return -1
}

func cublasSnrm2(unsafe.Pointer, unsafe.Pointer, int, unsafe.Pointer) (float32, int) { return 0, -1 }
