/* A stand-in for libcudart with the entry points the loader resolves.
 * DEVICES is what cudaGetDeviceCount reports; 0 makes it fail the way the
 * real runtime does on a host without a GPU (cudaErrorNoDevice, 100). */
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
int cudaIpcOpenMemHandle(void) { return 0; }
int cudaIpcCloseMemHandle(void) { return 0; }
int cudaStreamCreate(void) { return 0; }
int cudaStreamSynchronize(void) { return 0; }
int cudaStreamDestroy(void) { return 0; }
int cudaStreamQuery(void) { return 0; }
int cudaMalloc(void) { return 0; }
int cudaFree(void) { return 0; }
int cudaMemcpy(void) { return 0; }
