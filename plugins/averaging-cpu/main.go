// Command cohort-averaging-cpu is the CPU averaging plugin: it averages the
// rank's arena with the other ranks through the coordinator's reduce
// server, folding ranks of one host through shared memory. See
// internal/averager.
package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/plugins/averaging-cpu/internal/averager"
	"github.com/cohortdl/cohort/shared/plugin"
)

func main() {
	plugin.Serve(plugin.ServeOptions{
		Name: "averaging-cpu",
		Averager: func(log hclog.Logger) (plugin.Averager, error) {
			return averager.New(log), nil
		},
	})
}
