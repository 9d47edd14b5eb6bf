// Package cudalib finds and loads the NVIDIA libraries cohort's GPU
// plugins run on, NCCL (libnccl.so.2), the CUDA runtime (libcudart.so.13
// or libcudart.so.12) and cuBLAS, with dlopen at run time: averaging-nccl
// for its collectives and folds, trainer-libtorch for the device block it
// hands the averager.
//
// Nothing links against them at build time: cohort builds and its plugin
// starts on machines without a GPU, where its Configure fails at
// once with a LoadError naming every file tried and why each failed. No CUDA or NCCL
// header is needed either; the few C types the package calls through are
// declared here (NCCL's and CUDA's result enums are C ints).
//
// The package owns discovery (Candidates, in the order documented on it),
// loading and symbol resolution (OpenNCCL, OpenRuntime, Load), and the
// calls that identify what was loaded (versions, device count), and the
// trampolines through which the plugins call the resolved entry points
// (calls.go).
package cudalib
