// Package cudalib finds and loads the NVIDIA libraries the NCCL averaging
// plugin runs on, NCCL (libnccl.so.2) and the CUDA runtime
// (libcudart.so.13 or libcudart.so.12), with dlopen at run time.
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
// trampolines through which internal/backend calls the resolved entry
// points (calls.go).
package cudalib
