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
	"os"
	"runtime/debug"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/trainer"
	"github.com/cohortdl/cohort/shared/plugin"
)

func main() {
	// The trainer's Go heap is mostly its data set (Fashion-MNIST: about
	// 240 MB of plain numbers, which the collector marks without scanning
	// them). At the default GOGC of 100 the heap may grow by as much again
	// before a collection, so the few MB of garbage an epoch makes
	// (checkpoint writes, batch reports) held tens of MB more every few
	// minutes of a long run. 5% keeps the slack near 12 MB, for a
	// collection every few epochs. GOGC, when set, still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(5)
	}
	// Serve moves fd 1 to stderr before it runs the factory, and the
	// factory is where libtorch gets loaded: nothing libtorch prints can
	// reach the go-plugin handshake.
	plugin.Serve(plugin.ServeOptions{Name: "trainer-libtorch", Trainer: trainer.Factory})
}
