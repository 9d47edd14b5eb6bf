//go:build cgo

package cudalib

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// buildLib compiles testdata/src into dir/name as a shared library, with
// the given -D flags.
func buildLib(t *testing.T, src, dir, name string, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-shared", "-fPIC", "-o", out, filepath.Join("testdata", src)}, defines...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, b)
	}
	return out
}

// hermetic is Options that see only what a test puts in dir: an empty
// root and an empty environment. The bare-soname candidates still reach
// the host's dynamic loader.
func hermetic(dir string) Options {
	return Options{Root: filepath.Join(dir, "root"), Getenv: func(string) string { return "" }}
}

func TestOpenNCCL(t *testing.T) {
	tests := []struct {
		name        string
		defines     []string
		wantVersion string
		// wantMissing is the SymbolError's Symbol when the load must fail.
		wantMissing string
	}{
		{name: "complete", wantVersion: "2.21.5"},
		{name: "old NCCL without ncclCommInitRankConfig", defines: []string{"-DOMIT_ncclCommInitRankConfig", "-DVERSION=2804"}, wantVersion: "2.8.4"},
		{name: "no ncclGetVersion", defines: []string{"-DOMIT_ncclGetVersion", "-DOMIT_ncclAllReduce"}, wantMissing: "ncclGetVersion"},
		{name: "no ncclAllReduce", defines: []string{"-DOMIT_ncclAllReduce"}, wantMissing: "ncclAllReduce"},
		{name: "neither init call", defines: []string{"-DOMIT_ncclCommInitRankConfig", "-DOMIT_ncclCommInitRank"},
			wantMissing: "ncclCommInitRankConfig or ncclCommInitRank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := buildLib(t, "fake_nccl.c", filepath.Join(dir, "lib"), "libnccl.so.2", tc.defines...)
			o := hermetic(dir)
			o.NCCLPath = filepath.Join(dir, "lib")
			n, err := OpenNCCL(o)
			if tc.wantMissing != "" {
				var se *SymbolError
				if !errors.As(err, &se) || se.Symbol != tc.wantMissing || se.Path != path {
					t.Fatalf("OpenNCCL: %v; want a SymbolError for %s in %s", err, tc.wantMissing, path)
				}
				if !strings.Contains(err.Error(), path+" (setting nccl_library): missing symbol "+tc.wantMissing) {
					t.Errorf("error does not give the path, its source and the symbol:\n%v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenNCCL: %v", err)
			}
			defer n.Close()
			if got := n.Source(); got != (Candidate{Path: path, From: "setting nccl_library"}) {
				t.Errorf("Source = %+v", got)
			}
			v, err := n.Version()
			if err != nil || v.String() != tc.wantVersion {
				t.Errorf("Version = %v, %v; want %s", v, err, tc.wantVersion)
			}
		})
	}
}

// A candidate that fails must not end the search.
func TestOpenFallsThrough(t *testing.T) {
	dir := t.TempDir()
	broken := buildLib(t, "fake_nccl.c", filepath.Join(dir, "set"), "libnccl.so.2", "-DOMIT_ncclAllReduce")
	good := buildLib(t, "fake_nccl.c", filepath.Join(dir, "env"), "libnccl.so.2")
	o := hermetic(dir)
	o.NCCLPath = broken
	o.Getenv = func(k string) string {
		if k == "COHORT_NCCL_LIBRARY" {
			return filepath.Dir(good)
		}
		return ""
	}
	n, err := OpenNCCL(o)
	if err != nil {
		t.Fatalf("OpenNCCL: %v", err)
	}
	defer n.Close()
	if got := n.Source(); got != (Candidate{Path: good, From: "COHORT_NCCL_LIBRARY"}) {
		t.Errorf("Source = %+v, want %s from COHORT_NCCL_LIBRARY", got, good)
	}
}

func TestOpenNotASharedLibrary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "libnccl.so.2")
	if err := os.WriteFile(path, []byte(strings.Repeat("this is a text file, not an ELF object\n", 4)), 0o644); err != nil {
		t.Fatal(err)
	}
	o := hermetic(dir)
	o.NCCLPath = path
	_, err := OpenNCCL(o)
	var oe *OpenError
	if !errors.As(err, &oe) || oe.Path != path || !strings.Contains(oe.Reason, "invalid ELF header") {
		t.Fatalf("OpenNCCL: %v; want an OpenError for %s with dlopen's reason", err, path)
	}
	if !strings.Contains(err.Error(), path+" (setting nccl_library): dlopen: ") {
		t.Errorf("error does not give dlopen's reason on the file's line:\n%v", err)
	}
}

// A real library that is some other library fails on the first symbol of
// the list, and is closed again.
func TestOpenOtherLibrary(t *testing.T) {
	tests := []struct {
		lib  Library
		want string
	}{
		{LibNCCL, "ncclGetVersion"},
		{LibRuntime, "cudaRuntimeGetVersion"},
		{LibBLAS, "cublasCreate_v2"},
	}
	for _, tc := range tests {
		_, err := openCandidate(tc.lib, Candidate{Path: "libm.so.6", From: "test"})
		var se *SymbolError
		if !errors.As(err, &se) || se.Symbol != tc.want {
			t.Errorf("%s from libm.so.6: %v; want missing symbol %s", tc.lib, err, tc.want)
		}
	}
}

func TestRuntime(t *testing.T) {
	tests := []struct {
		name    string
		devices string
		want    int
		// wantCode and wantMsg are the CallError when the count fails.
		wantCode int
		wantMsg  string
	}{
		{name: "two GPUs", devices: "-DDEVICES=2", want: 2},
		{name: "no GPU", devices: "-DDEVICES=0", wantCode: 100, wantMsg: "no CUDA-capable device is detected"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// Only the older soname: the search must go on past .13.
			path := buildLib(t, "fake_cudart.c", filepath.Join(dir, "cuda"), "libcudart.so.12", tc.devices)
			o := hermetic(dir)
			o.RuntimePath = filepath.Join(dir, "cuda")
			r, err := OpenRuntime(o)
			if err != nil {
				t.Fatalf("OpenRuntime: %v", err)
			}
			if r.Source().Path != path {
				t.Errorf("loaded %s, want %s", r.Source().Path, path)
			}
			if v, err := r.Version(); err != nil || v.String() != "12.4.0" {
				t.Errorf("Version = %v, %v; want 12.4.0", v, err)
			}
			if id, err := r.PCIBusID(2); err != nil || id != "0000:03:00.0" {
				t.Errorf("PCIBusID(2) = %q, %v; want the fake's 0000:03:00.0", id, err)
			}
			// The handle goes out and comes back in by value, as CUDA's.
			var x int
			h, err := r.IPCHandleOf(DevicePtr{unsafe.Pointer(&x)})
			if err != nil {
				t.Fatalf("IPCHandleOf: %v", err)
			}
			if p, err := r.IPCOpen(h); err != nil || p.p != unsafe.Pointer(&x) {
				t.Errorf("IPCOpen(IPCHandleOf(p)) = %v, %v; want p back", p.p, err)
			}
			h[63] = 0
			if _, err := r.IPCOpen(h); err == nil {
				t.Errorf("IPCOpen of a handle the runtime did not make: no error")
			}
			n, err := r.DeviceCount()
			var ce *CallError
			switch {
			case tc.wantMsg == "" && (err != nil || n != tc.want):
				t.Errorf("DeviceCount = %d, %v; want %d", n, err, tc.want)
			case tc.wantMsg != "" && (!errors.As(err, &ce) || ce.Code != tc.wantCode || ce.Message != tc.wantMsg || ce.Func != "cudaGetDeviceCount"):
				t.Errorf("DeviceCount = %d, %v; want cudaGetDeviceCount's error %d %q", n, err, tc.wantCode, tc.wantMsg)
			}
			if err := r.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := r.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if _, err := r.DeviceCount(); err == nil || !strings.Contains(err.Error(), "after Close") {
				t.Errorf("DeviceCount after Close: %v; want an error", err)
			}
		})
	}
}

// cuBLAS's calls pass alpha by pointer and the vectors with unit strides:
// the fake computes on host memory, so a call that gets them wrong gets
// wrong numbers or a status.
func TestBLAS(t *testing.T) {
	dir := t.TempDir()
	path := buildLib(t, "fake_cublas.c", filepath.Join(dir, "blas"), "libcublas.so.12")
	o := hermetic(dir)
	o.BLASPath = filepath.Join(dir, "blas")
	b, err := OpenBLAS(o)
	if err != nil {
		t.Fatalf("OpenBLAS: %v", err)
	}
	defer b.Close()
	if b.Source() != (Candidate{Path: path, From: "setting cublas_library"}) {
		t.Errorf("Source = %+v", b.Source())
	}
	h, err := b.Create()
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	x, y := []float32{1, 2, 3, 4}, []float32{10, 20, 30, 40}
	if err := b.Scale(h, 3, 0.5, DevicePtr{unsafe.Pointer(&x[0])}); err != nil {
		t.Fatalf("Scale: %v", err)
	}
	if err := b.Axpy(h, 2, 2, DevicePtr{unsafe.Pointer(&x[1])}, DevicePtr{unsafe.Pointer(&y[2])}); err != nil {
		t.Fatalf("Axpy: %v", err)
	}
	if want := []float32{0.5, 1, 1.5, 4}; !slices.Equal(x, want) {
		t.Errorf("after Scale(3, 0.5): %v, want %v", x, want)
	}
	if want := []float32{10, 20, 32, 43}; !slices.Equal(y, want) {
		t.Errorf("after Axpy(2, 2, x[1:], y[2:]): %v, want %v", y, want)
	}
	if n, err := b.Norm(h, 2, DevicePtr{unsafe.Pointer(&y[2])}); err != nil || math.Abs(n-math.Hypot(32, 43)) > 1e-4 {
		t.Errorf("Norm(y[2:4]) = %v, %v; want %v", n, err, math.Hypot(32, 43))
	}
	var ce *CallError
	if err := b.Scale(BLASHandle{}, 1, 1, DevicePtr{unsafe.Pointer(&x[0])}); !errors.As(err, &ce) || ce.Message != "CUBLAS_STATUS_INVALID_VALUE" {
		t.Errorf("Scale on no handle: %v; want CUBLAS_STATUS_INVALID_VALUE", err)
	}
	if err := b.Destroy(h); err != nil {
		t.Errorf("Destroy: %v", err)
	}

	broken := buildLib(t, "fake_cublas.c", filepath.Join(dir, "broken"), "libcublas.so.13", "-DOMIT_cublasSaxpy_v2")
	o.BLASPath = broken
	_, err = OpenBLAS(o)
	if !strings.Contains(err.Error(), broken+" (setting cublas_library): missing symbol cublasSaxpy_v2") {
		t.Errorf("OpenBLAS of a library without cublasSaxpy_v2: %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	o := hermetic(dir)
	o.NCCLPath = filepath.Dir(buildLib(t, "fake_nccl.c", filepath.Join(dir, "nccl"), "libnccl.so.2"))
	o.RuntimePath = filepath.Dir(buildLib(t, "fake_cudart.c", filepath.Join(dir, "cuda"), "libcudart.so.13", "-DDEVICES=1"))
	libs, err := Load(o)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if n, err := libs.Runtime.DeviceCount(); err != nil || n != 1 {
		t.Errorf("DeviceCount = %d, %v; want 1", n, err)
	}
	if err := libs.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// On a host without the libraries the one error names both libraries,
// every place each was looked for and why each failed, and what to do.
func TestLoadNothingFound(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{
		"HOME":                  filepath.Join(dir, "home"),
		"VIRTUAL_ENV":           filepath.Join(dir, "venv"),
		"LD_LIBRARY_PATH":       filepath.Join(dir, "ld"),
		"COHORT_CUDART_LIBRARY": filepath.Join(dir, "cudart"),
	}
	o := Options{
		NCCLPath: filepath.Join(dir, "nccl"),
		Root:     filepath.Join(dir, "root"),
		Getenv:   func(k string) string { return env[k] },
	}
	libs, err := Load(o)
	if err == nil {
		libs.Close()
		t.Skip("the dynamic loader found NCCL and the CUDA runtime on this host")
	}
	msg := err.Error()
	var failed []Library
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if le, ok := e.(*LoadError); ok {
				failed = append(failed, le.Library)
			}
		}
	}
	if !slices.Equal(failed, []Library{LibNCCL, LibRuntime}) {
		t.Errorf("Load's error joins LoadErrors for %v, want NCCL's and the runtime's", failed)
	}
	for _, lib := range []Library{LibNCCL, LibRuntime} {
		if !strings.Contains(msg, "cannot load "+lib.String()+"; tried:") {
			t.Errorf("error does not name %s:\n%s", lib, msg)
		}
		s := lib.spec()
		if !strings.Contains(msg, s.setting) || !strings.Contains(msg, s.env) {
			t.Errorf("error does not name %s's setting and variable:\n%s", lib, msg)
		}
		for _, c := range Candidates(lib, o) {
			want := "not found"
			if c.From == "dynamic loader" {
				want = "dlopen: " + c.Path + ": cannot open shared object file"
			}
			if line := "\t" + c.Path + " (" + c.From + "): " + want; !strings.Contains(msg, line) {
				t.Errorf("error lacks the line %q:\n%s", line, msg)
			}
		}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(err, fs.ErrNotExist) = false; the attempts' errors must stay reachable")
	}
}
