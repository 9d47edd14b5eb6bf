// Package shim is the Go binding of libcohort_torch_shim.so, the C++
// library over libtorch that holds the libtorch trainer's model, optimizer
// and every tensor op: where the library is looked for, its dlopen and ABI
// check (shim.go, cgo and libdl only), the calls into it (Model), and the
// OS thread that runs them (Thread). The C side is ../../shim/ (the C ABI
// in cohort_torch_shim.h); the trainer that drives a Model is
// ../trainer, the data it trains on ../dataset.
package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
)

const (
	// Env names the shim to load instead of the default places.
	Env = "COHORT_TORCH_SHIM"
	// File is the shim's file name.
	File = "libcohort_torch_shim.so"
)

// Candidates lists the paths tried, in order: $COHORT_TORCH_SHIM alone
// when set; otherwise the plugin binary's directory, then bin/plugins.
func Candidates() []string {
	if p := os.Getenv(Env); p != "" {
		return []string{p}
	}
	var out []string
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		out = append(out, filepath.Join(filepath.Dir(exe), File))
	}
	return append(out, filepath.Join("bin", "plugins", File))
}

// MallocMmapThreshold and MallocTrimThreshold are the glibc malloc settings
// the plugin makes unless the environment made its own (mallocChosen).
// glibc's defaults adapt the first and derive the second from it, and with
// libtorch's pattern of per-step tensors (a batch's activations and
// gradients, freed and allocated again every step) the heap's free top
// crosses the derived trim threshold over and over: it is given back to
// the kernel after one step and faulted in again, page by page, in the
// next. A lone rank at 2 threads took about 200,000 page faults a second
// and 1.15 s an epoch of the default MLP that way, and 300 a second and
// 0.80 s with these settings. Blocks below 32 MiB (glibc's largest mmap
// threshold) come from the heap, and up to 64 MiB of its free top stays
// mapped between steps.
const (
	MallocMmapThreshold = 32 << 20
	MallocTrimThreshold = 64 << 20
)

// mallocChosen says whether env (as os.Environ) sets any of the glibc
// malloc settings the plugin would make, as a variable of its own
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_,
// MALLOC_MMAP_MAX_) or in GLIBC_TUNABLES: the user's choice then stands
// whole.
func mallocChosen(env []string) bool {
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_":
			return true
		case "GLIBC_TUNABLES":
			for _, t := range strings.Split(v, ":") {
				name, _, _ := strings.Cut(t, "=")
				switch name {
				case "glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad", "glibc.malloc.mmap_max":
					return true
				}
			}
		}
	}
	return false
}

// MallocEnv is the plugin's malloc settings as environment variables, for
// a process that should allocate as the plugin does (a benchmark's plain
// libtorch loop); nil where env (as os.Environ) chose its own.
func MallocEnv(env []string) []string {
	if mallocChosen(env) {
		return nil
	}
	return []string{fmt.Sprint("MALLOC_MMAP_THRESHOLD_=", MallocMmapThreshold), fmt.Sprint("MALLOC_TRIM_THRESHOLD_=", MallocTrimThreshold)}
}

// ModelSpec is what the shim builds; see ct_config.
type ModelSpec struct {
	Model        string
	Hidden       []int64
	InputShape   []int64
	Outputs      int64
	Loss         int32
	Optimizer    int32
	LR           float64
	Momentum     float64
	Nesterov     bool
	WeightDecay  float64
	Beta1, Beta2 float64
	Eps          float64
	MaxGradNorm  float64
	Seed         uint64
	Threads      int32
	Device       string
	Rank         uint32
	// AverageMoments (adam, adamw) adds each trained parameter's first
	// moment to the layout, as a buffer "optimizer.exp_avg.<parameter>".
	AverageMoments bool
	// CohortRanks, the world size (with AverageMoments), resizes after each
	// round each second moment's part since the previous round to a batch
	// as many times larger as the round averaged ranks; 0 is off. Above 1
	// it adds the buffer "optimizer.cohort_members" (CohortRanks f32) to
	// the layout, by which the shim counts them.
	CohortRanks uint32
}

// TensorInfo is one entry of the model's layout as the shim reports it.
type TensorInfo struct {
	Name  string
	DType arena.DType
	Role  arena.Role
	Shape []int64
	Bytes uint64
}

// Data is a training split as Model.TrainSteps reads it: N samples of
// Features values, as bytes (read as b/255) or float32, and N class labels
// or N*Width float targets. One of U8 and F32 is set, and one of Labels
// and Targets.
type Data struct {
	N, Features, Width int
	U8                 []uint8
	F32                []float32
	Labels             []int64
	Targets            []float32
}

// Step is what Model.TrainSteps reports of one optimizer step.
type Step struct {
	Loss float64
	// Gather is the time the shim took to copy the batch out of the data
	// set; Total adds the step's.
	Gather, Total time.Duration
	Rows          int
}
