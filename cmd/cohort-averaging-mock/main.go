// Command cohort-averaging-mock serves the mock averager of shared/plugintest
// as a cohort averaging plugin: ranks of one host average through files in
// the directory given as the endpoint.
package main

import (
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

func main() {
	plugin.Serve(plugin.ServeOptions{Name: "averaging-mock", Averager: plugintest.AveragerFactory})
}
