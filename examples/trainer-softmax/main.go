// Command cohort-trainer-softmax is a cohort trainer plugin: a softmax
// classifier that trains in place in the arena, on Fashion-MNIST or on
// synthetic data. The trainer lives in package softmax; this binary only
// serves it. See README.md.
package main

import (
	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/plugin"

	"example.com/cohort-trainer-softmax/softmax"
)

func main() {
	plugin.Serve(plugin.ServeOptions{
		Name:    "trainer-softmax",
		Trainer: func(log hclog.Logger) (plugin.Trainer, error) { return softmax.New(log), nil },
	})
}
