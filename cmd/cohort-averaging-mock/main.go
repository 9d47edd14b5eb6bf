// Command cohort-averaging-mock serves the mock averager of shared/plugintest
// as a cohort averaging plugin: the ranks average through the coordinator's
// relay and nothing else, so it runs wherever the ranks reach their
// coordinator, across hosts too. Every rank receives every rank's
// parameters: it is for tests and small models.
package main

import (
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

func main() {
	plugin.Serve(plugin.ServeOptions{Name: "averaging-mock", Averager: plugintest.AveragerFactory})
}
