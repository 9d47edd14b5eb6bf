//go:build linux && cgo

package resources

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"
)

// fakeNVML stands in for the library: the embedded nil interface makes any
// call the sampler should not make panic (which openNVML turns into an error).
type fakeNVML struct {
	nvml.Interface
	initRet   nvml.Return
	missing   string // a symbol the library lacks
	devs      []nvml.Device
	shutdowns int
}

func (f *fakeNVML) Init() nvml.Return                  { return f.initRet }
func (f *fakeNVML) Shutdown() nvml.Return              { f.shutdowns++; return nvml.SUCCESS }
func (f *fakeNVML) Extensions() nvml.ExtendedInterface { return fakeExt{f} }
func (f *fakeNVML) DeviceGetCount() (int, nvml.Return) { return len(f.devs), nvml.SUCCESS }
func (f *fakeNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if f.devs[i] == nil {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return f.devs[i], nvml.SUCCESS
}

type fakeExt struct{ f *fakeNVML }

func (e fakeExt) LookupSymbol(s string) error {
	if s == e.f.missing {
		return errors.New("undefined symbol")
	}
	return nil
}

type fakeDevice struct {
	nvml.Device
	name    string
	util    nvml.Return // SUCCESS or the error GetUtilizationRates gives
	usedMem uint64
}

func (d *fakeDevice) GetName() (string, nvml.Return) { return d.name, nvml.SUCCESS }
func (d *fakeDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	return nvml.Utilization{Gpu: 42, Memory: 7}, d.util
}
func (d *fakeDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	return nvml.Memory{Total: 80 << 30, Used: d.usedMem, Free: 80<<30 - d.usedMem}, nvml.SUCCESS
}

func TestOpenNVMLFailures(t *testing.T) {
	log := hclog.NewNullLogger()
	for _, tc := range []struct {
		name      string
		lib       *fakeNVML
		err       string
		shutdowns int
	}{
		{"no library", &fakeNVML{initRet: nvml.ERROR_LIBRARY_NOT_FOUND}, "libnvidia-ml.so.1 not found", 0},
		{"no driver", &fakeNVML{initRet: nvml.ERROR_DRIVER_NOT_LOADED}, "init", 0},
		{"old library", &fakeNVML{missing: "nvmlDeviceGetMemoryInfo"}, "no nvmlDeviceGetMemoryInfo", 1},
		{"no shutdown to call", &fakeNVML{missing: "nvmlShutdown"}, "no nvmlShutdown", 0},
		{"no GPUs", &fakeNVML{}, "no GPUs", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := openNVML(tc.lib, log)
			if g != nil || err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("openNVML = %v, %v; want an error with %q", g, err, tc.err)
			}
			if tc.lib.shutdowns != tc.shutdowns {
				t.Errorf("Shutdown called %d times, want %d", tc.lib.shutdowns, tc.shutdowns)
			}
		})
	}
}

func TestNVMLSample(t *testing.T) {
	lib := &fakeNVML{devs: []nvml.Device{
		&fakeDevice{name: "NVIDIA H200", usedMem: 1 << 30},
		nil, // fell off the bus: skipped
		&fakeDevice{name: "NVIDIA H200 MIG 1g.18gb", util: nvml.ERROR_NOT_SUPPORTED, usedMem: 2 << 30},
	}}
	g, err := openNVML(lib, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	got := g.sample()
	if len(got) != 2 {
		t.Fatalf("got %d GPUs, want 2: %+v", len(got), got)
	}
	if got[0].Index != 0 || got[0].Name != "NVIDIA H200" || got[0].UtilPercent == nil || *got[0].UtilPercent != 42 ||
		*got[0].MemUsed != 1<<30 || *got[0].MemTotal != 80<<30 {
		t.Errorf("GPU 0: %+v", got[0])
	}
	if got[1].Index != 2 || got[1].UtilPercent != nil || *got[1].MemUsed != 2<<30 {
		t.Errorf("GPU 2: %+v (utilisation not supported should be nil)", got[1])
	}
	g.close()
	if lib.shutdowns != 1 {
		t.Errorf("Shutdown called %d times", lib.shutdowns)
	}
}

func TestOpenNVMLRecoversFromPanics(t *testing.T) {
	// A device whose methods are all missing: GetName panics on the nil interface.
	lib := &fakeNVML{devs: []nvml.Device{struct{ nvml.Device }{}}}
	if g, err := openNVML(lib, hclog.NewNullLogger()); g != nil || err == nil {
		t.Errorf("openNVML = %v, %v; want an error", g, err)
	}
}
