/* A stand-in for libcublas that computes on host memory, so the loader's
 * calls (handles, alpha by pointer, strides) are tested without a GPU.
 * Each OMIT_<symbol> macro leaves that symbol out. */
#define HANDLE ((void *)0x1234)

int cublasCreate_v2(void **h) { *h = HANDLE; return 0; }
int cublasDestroy_v2(void *h) { return h == HANDLE ? 0 : 7; }
int cublasSscal_v2(void *h, int n, const float *alpha, float *x, int incx) {
	if (h != HANDLE || incx != 1)
		return 7; /* CUBLAS_STATUS_INVALID_VALUE */
	for (int i = 0; i < n; i++)
		x[i] *= *alpha;
	return 0;
}
/* sqrt without libm, which a test process may not have loaded. */
static double root(double s) {
	double r = s > 1 ? s : 1;
	for (int i = 0; i < 64; i++)
		r = (r + s / r) / 2;
	return s > 0 ? r : 0;
}

int cublasSnrm2_v2(void *h, int n, const float *x, int incx, float *result) {
	if (h != HANDLE || incx != 1)
		return 7;
	double s = 0;
	for (int i = 0; i < n; i++)
		s += (double)x[i] * x[i];
	*result = (float)root(s);
	return 0;
}

#ifndef OMIT_cublasSaxpy_v2
int cublasSaxpy_v2(void *h, int n, const float *alpha, const float *x, int incx, float *y, int incy) {
	if (h != HANDLE || incx != 1 || incy != 1)
		return 7;
	for (int i = 0; i < n; i++)
		y[i] += *alpha * x[i];
	return 0;
}
#endif
