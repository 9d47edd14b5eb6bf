//go:build cgo

package cudalib

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

// dlerror's text sits in a per-thread buffer that the next dl call on that
// thread overwrites, and a goroutine may share its thread with another
// once back in Go; so each call copies the text out before returning.
typedef struct {
	void *ptr;
	char err[512];
} cohort_dl_result;

static void cohort_dl_error(cohort_dl_result *r) {
	const char *e = dlerror();
	snprintf(r->err, sizeof r->err, "%s", e != NULL ? e : "unknown error");
}

static cohort_dl_result cohort_dlopen(const char *path) {
	cohort_dl_result r = {0};
	dlerror();
	// RTLD_NOW: a dependency or symbol missing shows here, not at the
	// first call. RTLD_LOCAL: the library's symbols stay out of the
	// plugin's namespace.
	r.ptr = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (r.ptr == NULL) {
		cohort_dl_error(&r);
	}
	return r;
}

static cohort_dl_result cohort_dlsym(void *handle, const char *name) {
	cohort_dl_result r = {0};
	dlerror();
	r.ptr = dlsym(handle, name);
	if (r.ptr == NULL) {
		cohort_dl_error(&r);
	}
	return r;
}

static cohort_dl_result cohort_dlclose(void *handle) {
	cohort_dl_result r = {0};
	dlerror();
	if (dlclose(handle) != 0) {
		cohort_dl_error(&r);
		r.ptr = handle;
	}
	return r;
}

// The trampolines. NCCL's ncclResult_t and CUDA's cudaError_t are C enums,
// int-sized on every ABI the libraries ship for.
typedef int (*cohort_int_out_fn)(int *);
typedef const char *(*cohort_error_string_fn)(int);

// cohort_call_int_out calls an `int f(int *out)` entry point:
// ncclGetVersion, cudaRuntimeGetVersion, cudaGetDeviceCount.
static int cohort_call_int_out(void *fn, int *out) {
	return ((cohort_int_out_fn)fn)(out);
}

// cohort_call_error_string calls ncclGetErrorString or cudaGetErrorString;
// both return static strings.
static const char *cohort_call_error_string(void *fn, int code) {
	const char *s = ((cohort_error_string_fn)fn)(code);
	return s != NULL ? s : "";
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// dlOpen opens path (a file, or a bare soname for the loader to find).
func dlOpen(path string) (unsafe.Pointer, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	r := C.cohort_dlopen(cpath)
	if r.ptr == nil {
		return nil, &OpenError{Path: path, Reason: C.GoString(&r.err[0])}
	}
	return r.ptr, nil
}

// dlSym resolves name in handle; the error is dlerror's text.
func dlSym(handle unsafe.Pointer, name string) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	r := C.cohort_dlsym(handle, cname)
	if r.ptr == nil {
		return nil, errors.New(C.GoString(&r.err[0]))
	}
	return r.ptr, nil
}

func dlClose(handle unsafe.Pointer) error {
	r := C.cohort_dlclose(handle)
	if r.ptr != nil {
		return errors.New(C.GoString(&r.err[0]))
	}
	return nil
}

// callIntOut calls fn(&out) and returns its result code and out.
func callIntOut(fn unsafe.Pointer) (code, out int) {
	var v C.int
	rc := C.cohort_call_int_out(fn, &v)
	return int(rc), int(v)
}

// callErrorString calls fn(code) for an error-string entry point.
func callErrorString(fn unsafe.Pointer, code int) string {
	return C.GoString(C.cohort_call_error_string(fn, C.int(code)))
}
