// Command cohort-trainer-mock serves the mock trainer of shared/plugintest as
// a cohort trainer plugin. With COHORT_MOCK_NOISE=1 it prints junk to stdout
// before the handshake, as libtorch does.
package main

import (
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

func main() {
	plugin.Serve(plugin.ServeOptions{Name: "trainer-mock", Trainer: plugintest.TrainerFactory})
}
