//go:build linux && cgo

package resources

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"
)

// go-nvml opens libnvidia-ml.so.1 with dlopen in Init, which fails cleanly
// (ERROR_LIBRARY_NOT_FOUND) when there is none. Its other functions are
// linked with unresolved symbols allowed: calling one before a successful
// Init, after Shutdown, or that the loaded library lacks, jumps to a null
// address and kills the process. So: nothing is called unless Init
// succeeded, every entry point used afterwards is looked up first, and the
// Sampler's mutex keeps Close from racing a sample.

// nvmlSymbols are the entry points used after Init; go-nvml calls the
// first of each set the library has.
var nvmlSymbols = [][]string{
	{"nvmlShutdown"},
	{"nvmlErrorString"},
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
	{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
	{"nvmlDeviceGetName"},
	{"nvmlDeviceGetUtilizationRates"},
	{"nvmlDeviceGetMemoryInfo"},
}

type nvmlGPUs struct {
	lib  nvml.Interface
	devs []nvmlDevice
}

type nvmlDevice struct {
	index uint32
	name  string
	dev   nvml.Device
}

func openGPUs(log hclog.Logger) (gpuSource, error) {
	g, err := openNVML(nvml.New(), log)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// openNVML starts lib and finds its devices; on error lib is shut down again
// where that is safe.
func openNVML(lib nvml.Interface, log hclog.Logger) (g *nvmlGPUs, err error) {
	defer func() {
		if r := recover(); r != nil {
			g, err = nil, fmt.Errorf("NVML: %v", r)
		}
	}()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, errors.New("NVML: libnvidia-ml.so.1 not found")
		}
		return nil, fmt.Errorf("NVML: init: %s", retString(lib, ret))
	}
	ext := lib.Extensions()
	for _, alts := range nvmlSymbols {
		found := false
		for _, sym := range alts {
			if ext.LookupSymbol(sym) == nil {
				found = true
				break
			}
		}
		if !found {
			if alts[0] != "nvmlShutdown" {
				lib.Shutdown()
			}
			return nil, fmt.Errorf("NVML: the library has no %s", alts[0])
		}
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n <= 0 {
		lib.Shutdown()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML: device count: %s", retString(lib, ret))
		}
		return nil, errors.New("NVML: no GPUs")
	}
	g = &nvmlGPUs{lib: lib}
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Debug("NVML: skipping a GPU", "index", i, "error", retString(lib, ret))
			continue
		}
		name, ret := dev.GetName()
		if ret != nvml.SUCCESS {
			name = ""
		}
		g.devs = append(g.devs, nvmlDevice{index: uint32(i), name: name, dev: dev})
	}
	log.Debug("NVML: sampling GPUs", "count", len(g.devs))
	return g, nil
}

func (g *nvmlGPUs) sample() (out []GPU) {
	defer func() {
		if r := recover(); r != nil {
			out = nil
		}
	}()
	out = make([]GPU, 0, len(g.devs))
	for _, d := range g.devs {
		gpu := GPU{Index: d.index, Name: d.name}
		if u, ret := d.dev.GetUtilizationRates(); ret == nvml.SUCCESS {
			p := float32(min(u.Gpu, 100))
			gpu.UtilPercent = &p
		}
		if m, ret := d.dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			gpu.MemUsed, gpu.MemTotal = &m.Used, &m.Total
		}
		out = append(out, gpu)
	}
	return out
}

func (g *nvmlGPUs) close() {
	defer func() { _ = recover() }()
	g.lib.Shutdown()
}

// retString names ret: NVML's own text when the library has nvmlErrorString
// (or is not loaded, when go-nvml has its own), its number otherwise.
func retString(lib nvml.Interface, ret nvml.Return) string {
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND || lib.Extensions().LookupSymbol("nvmlErrorString") == nil {
		return ret.Error()
	}
	return fmt.Sprintf("NVML return code %d", int32(ret))
}
