package cudalib

import "fmt"

// Library is one of the NVIDIA libraries the plugin loads.
type Library int

const (
	// LibNCCL is NCCL 2.x, libnccl.so.2.
	LibNCCL Library = iota
	// LibRuntime is the CUDA runtime, libcudart.so.13 or libcudart.so.12.
	LibRuntime
	// LibBLAS is cuBLAS, libcublas.so.13 or libcublas.so.12: the fold of
	// the ranks that share a GPU scales and adds on the device with it.
	LibBLAS
)

// spec is what discovery and loading need to know about a Library. It is
// built on each call, so nothing package-wide can be changed under a
// concurrent load.
type spec struct {
	name string
	// sonames are tried in this order in every place searched: a newer
	// runtime first, since a driver runs every older runtime too.
	sonames []string
	// setting is the plugin's settings key holding an explicit path; env
	// is the environment variable doing the same.
	setting string
	env     string
	// symbols must all resolve; each entry lists alternatives, the first
	// that resolves standing for the entry.
	symbols [][]string
	// install says how to get the library, for the error when none loads.
	install string
}

func (l Library) spec() spec {
	switch l {
	case LibNCCL:
		return spec{
			name:    "NCCL",
			sonames: []string{"libnccl.so.2"},
			setting: "nccl_library",
			env:     "COHORT_NCCL_LIBRARY",
			symbols: [][]string{
				{"ncclGetVersion"},
				{"ncclGetUniqueId"},
				// ncclCommInitRankConfig (NCCL 2.14+) makes communicator
				// creation non-blocking, so a wedged peer can be aborted;
				// older NCCL only has the blocking call.
				{"ncclCommInitRankConfig", "ncclCommInitRank"},
				{"ncclAllReduce"},
				{"ncclBroadcast"},
				{"ncclCommAbort"},
				{"ncclCommDestroy"},
				{"ncclCommGetAsyncError"},
				{"ncclGetErrorString"},
			},
			install: "install NCCL 2.x (the libnccl2 package, or `pip install nvidia-nccl-cu12` / `nvidia-nccl-cu13`, which a CUDA build of PyTorch brings along)",
		}
	case LibRuntime:
		return spec{
			name:    "the CUDA runtime",
			sonames: []string{"libcudart.so.13", "libcudart.so.12"},
			setting: "cudart_library",
			env:     "COHORT_CUDART_LIBRARY",
			symbols: [][]string{
				{"cudaRuntimeGetVersion"},
				{"cudaGetDeviceCount"},
				{"cudaSetDevice"},
				{"cudaGetErrorString"},
				{"cudaDeviceSynchronize"},
				{"cudaDeviceGetPCIBusId"},
				{"cudaIpcGetMemHandle"},
				{"cudaIpcOpenMemHandle"},
				{"cudaIpcCloseMemHandle"},
				{"cudaStreamCreate"},
				{"cudaStreamSynchronize"},
				{"cudaStreamDestroy"},
				{"cudaStreamQuery"},
				{"cudaMalloc"},
				{"cudaFree"},
				{"cudaMemcpy"},
			},
			install: "install the CUDA runtime 12 or 13 (the CUDA toolkit, or `pip install nvidia-cuda-runtime-cu12` / `nvidia-cuda-runtime`, which a CUDA build of PyTorch brings along)",
		}
	case LibBLAS:
		return spec{
			name:    "cuBLAS",
			sonames: []string{"libcublas.so.13", "libcublas.so.12"},
			setting: "cublas_library",
			env:     "COHORT_CUBLAS_LIBRARY",
			symbols: [][]string{
				{"cublasCreate_v2"},
				{"cublasDestroy_v2"},
				{"cublasSscal_v2"},
				{"cublasSaxpy_v2"},
				{"cublasSnrm2_v2"},
			},
			install: "install cuBLAS 12 or 13 (the CUDA toolkit, or `pip install nvidia-cublas-cu12` / `nvidia-cublas`, which a CUDA build of PyTorch brings along)",
		}
	}
	panic(fmt.Sprintf("cudalib: unknown Library %d", int(l)))
}

// String names the library and its sonames, e.g. "NCCL (libnccl.so.2)".
func (l Library) String() string {
	if l != LibNCCL && l != LibRuntime && l != LibBLAS {
		return fmt.Sprintf("Library(%d)", int(l))
	}
	s := l.spec()
	names := s.sonames[0]
	for _, n := range s.sonames[1:] {
		names += " or " + n
	}
	return s.name + " (" + names + ")"
}

// Version is a library's version.
type Version struct {
	Major, Minor, Patch int
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// ncclVersion decodes ncclGetVersion's code: major*10000+minor*100+patch
// since NCCL 2.9, major*1000+minor*100+patch before (2.8.4 is 2804).
func ncclVersion(code int) Version {
	if code >= 10000 {
		return Version{code / 10000, code % 10000 / 100, code % 100}
	}
	return Version{code / 1000, code % 1000 / 100, code % 100}
}

// runtimeVersion decodes cudaRuntimeGetVersion's code,
// major*1000+minor*10 (12.4 is 12040).
func runtimeVersion(code int) Version {
	return Version{code / 1000, code % 1000 / 10, 0}
}
