/* A stand-in for libcudart with the entry points the loader resolves.
 * DEVICES is what cudaGetDeviceCount reports; 0 makes it fail the way the
 * real runtime does on a host without a GPU (cudaErrorNoDevice, 100). */
#include <stdio.h>
#include <string.h>

#ifndef DEVICES
#define DEVICES 0
#endif

int cudaRuntimeGetVersion(int *v) { *v = 12040; return 0; }
int cudaGetDeviceCount(int *n) {
	if (DEVICES == 0) {
		*n = 0;
		return 100;
	}
	*n = DEVICES;
	return 0;
}
const char *cudaGetErrorString(int code) {
	return code == 100 ? "no CUDA-capable device is detected" : "fake cuda error";
}
int cudaSetDevice(void) { return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaDeviceGetPCIBusId(char *out, int len, int dev) {
	snprintf(out, len, "0000:%02x:00.0", dev + 1);
	return 0;
}
/* The handle carries the pointer and a mark, so a round trip through the
 * loader's by-value passing can be checked. */
typedef struct { char reserved[64]; } ipc_handle;
int cudaIpcGetMemHandle(ipc_handle *h, void *p) {
	memset(h, 0, sizeof *h);
	memcpy(h->reserved, &p, sizeof p);
	h->reserved[63] = 0x5a;
	return 0;
}
int cudaIpcOpenMemHandle(void **out, ipc_handle h, unsigned int flags) {
	if (h.reserved[63] != 0x5a || flags != 1)
		return 201; /* cudaErrorInvalidContext, say */
	memcpy(out, h.reserved, sizeof *out);
	return 0;
}
int cudaIpcCloseMemHandle(void) { return 0; }
int cudaStreamCreate(void) { return 0; }
int cudaStreamSynchronize(void) { return 0; }
int cudaStreamDestroy(void) { return 0; }
int cudaStreamQuery(void) { return 0; }
int cudaMalloc(void) { return 0; }
int cudaFree(void) { return 0; }
int cudaMemcpy(void) { return 0; }
