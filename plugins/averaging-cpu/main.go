// Command cohort-averaging-cpu is the CPU averaging plugin: it averages the
// rank's arena with the other ranks through the coordinator's reduce
// server, folding ranks of one host through shared memory. See
// internal/averager.
package main

import (
	"os"
	"runtime/debug"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/plugins/averaging-cpu/internal/averager"
	"github.com/cohortdl/cohort/shared/plugin"
)

func main() {
	// The averager's live heap is about 3 MB and flat. At the default GOGC
	// of 100 the heap may double before a collection, and the pages of
	// each peak stay resident until the scavenger returns what lies above
	// that goal: over a long run its resident memory climbed by 1.3 MB, a
	// fifth, with no more live. 25 narrows that band to a quarter; the
	// averager allocates little between rounds, so it collects seldom even
	// so. GOGC, when set, still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	plugin.Serve(plugin.ServeOptions{
		Name: "averaging-cpu",
		Averager: func(log hclog.Logger) (plugin.Averager, error) {
			return averager.New(log), nil
		},
	})
}
