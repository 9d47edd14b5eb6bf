// Command cohort-averaging-trimmedmean is a cohort averaging plugin: each
// round replaces every coordinate of the rank's parameters with the
// trimmed mean over the ranks that trained, dropping the `trim` highest
// and lowest values, so one rank gone wrong (diverged, corrupted, fed bad
// data) cannot drag the cohort along. The averager lives in package
// trimmedmean; this binary only serves it. See README.md.
package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/plugin"

	"example.com/cohort-averaging-trimmedmean/trimmedmean"
)

func main() {
	plugin.Serve(plugin.ServeOptions{
		Name: "averaging-trimmedmean",
		Averager: func(log hclog.Logger) (plugin.Averager, error) {
			return trimmedmean.New(log), nil
		},
	})
}
