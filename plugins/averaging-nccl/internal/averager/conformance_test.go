package averager

import (
	"testing"

	"github.com/cohortdl/cohort/internal/cudalib"
	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// onFabric is an OpenFunc handing out fake ranks of f: the suite's
// averagers all live in this process, and their communicators meet on f
// by the unique ids the relay carries.
func onFabric(f *backend.Fabric) OpenFunc {
	return func(cudalib.Options) (backend.Backend, error) { return f.Backend(), nil }
}

func TestConformance(t *testing.T) {
	f := backend.NewFabric(1)
	conformance.RunAverager(t, func(conformance.T) (plugin.Averager, error) { return New(nil, onFabric(f)), nil },
		conformance.Settings([]byte(`{"smoothing": 0}`)),
		conformance.Gamma(2, []byte(`{"gamma": 2, "smoothing": 0}`)),
		conformance.Stateful([]byte(`{"smoothing": 0.5}`)))
	if n := f.Live(); n != 0 {
		t.Errorf("%d communicators outlived their averagers' Shutdown", n)
	}
}
