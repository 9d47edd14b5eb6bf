package main

import (
	"os"
	"path/filepath"

	"github.com/cohortdl/cohort/shared/arena"
)

// shimCandidates lists the paths tried, in order: $COHORT_TORCH_SHIM alone
// when set; otherwise the plugin binary's directory, then bin/plugins.
func shimCandidates() []string {
	if p := os.Getenv(shimEnv); p != "" {
		return []string{p}
	}
	var out []string
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		out = append(out, filepath.Join(filepath.Dir(exe), shimFile))
	}
	return append(out, filepath.Join("bin", "plugins", shimFile))
}

// modelSpec is what the shim builds; see ct_config.
type modelSpec struct {
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
}

// tensorInfo is one entry of the model's layout as the shim reports it.
type tensorInfo struct {
	Name  string
	DType arena.DType
	Role  arena.Role
	Shape []int64
	Bytes uint64
}
