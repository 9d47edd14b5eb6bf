// Command cohort-trainer-libtorch is cohort's trainer plugin over libtorch.
//
// The Go side (this package) parses the settings, reads the data (IDX and
// .npy, bounds-checked), derives each plan's samples through plugin.Picker, maps
// the arena and checkpoints; the model, its optimizer and every tensor op
// live in libcohort_torch_shim.so, a thin C++ library over libtorch that this
// binary dlopens at run time (libdl only: no link-time libtorch). The shim is
// looked for in $COHORT_TORCH_SHIM, next to this binary, then in
// bin/plugins. See README.md for the settings and the arena contract.
package main

import "github.com/cohortdl/cohort/shared/plugin"

func main() {
	// Serve moves fd 1 to stderr before it runs the factory, and the
	// factory is where libtorch gets loaded: nothing libtorch prints can
	// reach the go-plugin handshake.
	plugin.Serve(plugin.ServeOptions{Name: "trainer-libtorch", Trainer: newTrainer})
}
