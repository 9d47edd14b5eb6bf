// Command cohort-averaging-nccl is the NCCL averaging plugin: it averages
// the rank's arena with the other ranks by an NCCL all-reduce on a GPU,
// loading NCCL and the CUDA runtime at run time. See internal/averager.
package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/averager"
	"github.com/cohortdl/cohort/shared/plugin"
)

func main() {
	plugin.Serve(plugin.ServeOptions{
		Name: "averaging-nccl",
		Averager: func(log hclog.Logger) (plugin.Averager, error) {
			return averager.New(log, averager.OpenNCCL), nil
		},
	})
}
