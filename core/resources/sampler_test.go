package resources

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

type fakeGPUs struct {
	gpus   []GPU
	closed int
}

func (f *fakeGPUs) sample() []GPU { return f.gpus }
func (f *fakeGPUs) close()        { f.closed++ }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSamplerFixedProc(t *testing.T) {
	proc := t.TempDir()
	writeFile(t, filepath.Join(proc, "stat"), "cpu  100 0 100 700 100 0 0 0 0 0\n")
	writeFile(t, filepath.Join(proc, "meminfo"), readTestdata(t, "meminfo.txt"))
	writeFile(t, filepath.Join(proc, "self", "statm"), "1000 408 100 10 0 300 0\n")
	util, used, total := float32(87), uint64(3<<30), uint64(80<<30)
	gpus := &fakeGPUs{gpus: []GPU{{Index: 0, Name: "H200", UtilPercent: &util, MemUsed: &used, MemTotal: &total}}}
	s := &Sampler{log: hclog.NewNullLogger(), proc: proc, gpus: gpus, failed: map[string]bool{}}

	first := s.Sample()
	if first.CPUPercent != nil {
		t.Errorf("first sample has CPU %v, want nil", *first.CPUPercent)
	}
	if first.RAMTotal == nil || *first.RAMTotal != 24684084<<10 || *first.RAMUsed != (24684084-24164412)<<10 {
		t.Errorf("RAM %v / %v", first.RAMUsed, first.RAMTotal)
	}
	if first.RSS == nil || *first.RSS != uint64(408*os.Getpagesize()) {
		t.Errorf("RSS %v", first.RSS)
	}
	if len(first.GPUs) != 1 || first.GPUs[0].Name != "H200" || *first.GPUs[0].UtilPercent != 87 {
		t.Errorf("GPUs %+v", first.GPUs)
	}
	if first.Time.IsZero() {
		t.Error("no time")
	}

	writeFile(t, filepath.Join(proc, "stat"), "cpu  130 0 120 740 110 0 0 0 0 0\n") // 50 busy of 100
	if second := s.Sample(); second.CPUPercent == nil || *second.CPUPercent != 50 {
		t.Errorf("second CPU %v, want 50", second.CPUPercent)
	}

	// What cannot be read is nil, and the next good read carries on.
	os.Remove(filepath.Join(proc, "meminfo"))
	writeFile(t, filepath.Join(proc, "stat"), "garbage\n")
	writeFile(t, filepath.Join(proc, "self", "statm"), "1000 x\n")
	bad := s.Sample()
	if bad.CPUPercent != nil || bad.RAMTotal != nil || bad.RAMUsed != nil || bad.RSS != nil {
		t.Errorf("unreadable files gave %+v", bad)
	}
	writeFile(t, filepath.Join(proc, "stat"), "cpu  130 0 120 840 110 0 0 0 0 0\n")
	if again := s.Sample(); again.CPUPercent == nil || *again.CPUPercent != 0 {
		t.Errorf("CPU after a failed read %v, want 0 against the last good one", again.CPUPercent)
	}

	s.Close()
	s.Close()
	if gpus.closed != 1 {
		t.Errorf("GPU source closed %d times, want 1", gpus.closed)
	}
	if after := s.Sample(); len(after.GPUs) != 0 {
		t.Errorf("GPUs after Close: %+v", after.GPUs)
	}
}

func TestSamplerLive(t *testing.T) {
	s := New(hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: testWriter{t}}))
	defer s.Close()
	first := s.Sample()
	if first.RAMTotal == nil || *first.RAMTotal == 0 || *first.RAMUsed > *first.RAMTotal {
		t.Errorf("RAM %v / %v", first.RAMUsed, first.RAMTotal)
	}
	if first.CPUPercent != nil {
		t.Error("first sample has a CPU share")
	}
	var second Sample
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // the kernel counts in 10 ms ticks
		if second = s.Sample(); second.CPUPercent != nil {
			break
		}
	}
	if second.CPUPercent == nil || *second.CPUPercent < 0 || *second.CPUPercent > 100 {
		t.Errorf("second CPU %v, want a share in [0, 100]", second.CPUPercent)
	}
	if s.gpus == nil && len(second.GPUs) != 0 {
		t.Errorf("GPUs without NVML: %+v", second.GPUs)
	}
	for _, g := range second.GPUs {
		t.Logf("GPU %d %q util %v mem %v/%v", g.Index, g.Name, deref(g.UtilPercent), deref(g.MemUsed), deref(g.MemTotal))
	}
}

func TestSamplerConcurrent(t *testing.T) {
	s := New(nil)
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 20 {
				s.Sample()
			}
		}()
	}
	<-done
	s.Close()
	<-done
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
