// Package resources samples this process's host: CPU from /proc/stat,
// memory from /proc/meminfo, the process's own resident size from
// /proc/self/statm, named processes' CPU and resident size from
// /proc/PID/stat and statm, and GPUs through NVML when a driver is
// present. SelfMemory and ProcessMemory read smaps_rollup (PSS and the
// rest) for callers that want them once, not every sample.
//
// NVML (libnvidia-ml.so.1) is loaded at run time: a host without the
// library or driver, or a binary built without cgo, samples without GPUs.
package resources

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Sample is one reading. A nil field could not be read this time.
type Sample struct {
	CPUPercent *float32 // busy share of all cores since the previous Sample, [0, 100]
	RAMUsed    *uint64  // bytes: MemTotal - MemAvailable
	RAMTotal   *uint64  // bytes
	RSS        *uint64  // bytes resident in this process
	GPUs       []GPU    // every GPU NVML sees; empty without NVML
	Time       time.Time
}

// GPU is one device's reading. Index is NVML's index, which
// CUDA_VISIBLE_DEVICES does not remap.
type GPU struct {
	Index       uint32
	Name        string
	UtilPercent *float32 // busy share over the driver's last sample period
	MemUsed     *uint64  // bytes
	MemTotal    *uint64  // bytes
}

// gpuSource reads the GPUs; nvml.go has the real one.
type gpuSource interface {
	sample() []GPU
	close()
}

// Sampler takes Samples. It is safe for concurrent use.
type Sampler struct {
	log  hclog.Logger
	proc string // the proc filesystem's root, "/proc"

	mu     sync.Mutex
	prev   *CPUStat
	gpus   gpuSource // nil: no NVML
	failed map[string]bool
	procs  map[int]procTime // each sampled process's last CPU time
}

// New returns a Sampler, with GPUs if NVML starts. No NVML library or
// driver is no error: it is logged at debug and the Sampler reads no GPUs.
// A nil logger logs nothing.
func New(logger hclog.Logger) *Sampler {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &Sampler{log: logger, proc: "/proc", failed: map[string]bool{}}
	g, err := openGPUs(logger)
	if err != nil {
		logger.Debug("sampling without GPUs", "reason", err)
		return s
	}
	s.gpus = g
	return s
}

// Sample reads the host now. CPUPercent is nil on the first call, which
// only sets the baseline.
func (s *Sampler) Sample() Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Sample{Time: time.Now()}

	if cur, err := readWith(filepath.Join(s.proc, "stat"), ParseCPUStat); s.ok("cpu", err) {
		if s.prev != nil {
			if p, ok := CPUPercent(*s.prev, cur); ok {
				out.CPUPercent = &p
			}
		}
		s.prev = &cur
	}
	if m, err := readWith(filepath.Join(s.proc, "meminfo"), ParseMeminfo); s.ok("meminfo", err) {
		used := m.Used()
		out.RAMTotal, out.RAMUsed = &m.Total, &used
	}
	if rss, err := readWith(filepath.Join(s.proc, "self", "statm"), statmRSS); s.ok("statm", err) {
		out.RSS = &rss
	}
	if s.gpus != nil {
		out.GPUs = s.gpus.sample()
	}
	return out
}

// Close releases NVML. The Sampler still samples the host afterwards,
// without GPUs.
func (s *Sampler) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gpus != nil {
		s.gpus.close()
		s.gpus = nil
	}
}

// ok reports whether err is nil, logging the first failure of each kind
// at debug (a host without smaps_rollup would fail every second).
func (s *Sampler) ok(what string, err error) bool {
	if err == nil {
		return true
	}
	if !s.failed[what] {
		s.failed[what] = true
		s.log.Debug("resource sample incomplete", "what", what, "error", err)
	}
	return false
}

func readWith[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		var zero T
		return zero, err
	}
	return parse(bytes.NewReader(src))
}
