// Command cohort-trainer-libtorch is cohort's trainer plugin over libtorch.
//
// This package only serves the plugin; the work is in internal/:
// internal/trainer is the plugin.Trainer (settings, Configure, Train,
// Publish/Adopt, Evaluate, checkpoints), internal/dataset reads the data
// (IDX and .npy, bounds-checked) and gathers batches, and internal/shim
// loads libcohort_torch_shim.so, the thin C++ library over libtorch (shim/)
// that holds the model, its optimizer and every tensor op, and calls into
// it (libdl only: no link-time libtorch). See README.md for the settings,
// where the shim is looked for, and the arena contract.
package main

import (
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/trainer"
	"github.com/cohortdl/cohort/shared/plugin"
)

func main() {
	// Serve moves fd 1 to stderr before it runs the factory, and the
	// factory is where libtorch gets loaded: nothing libtorch prints can
	// reach the go-plugin handshake.
	plugin.Serve(plugin.ServeOptions{Name: "trainer-libtorch", Trainer: trainer.Factory})
}
