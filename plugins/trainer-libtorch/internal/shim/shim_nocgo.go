//go:build !cgo

package shim

import (
	"errors"
	"time"
)

// Without cgo the plugin cannot dlopen the shim; it builds (so `go build
// ./...` and `go vet ./...` pass with CGO_ENABLED=0) and refuses to start.

const ABI = 2

const ErrBufLen = 4096

var errNoCgo = errors.New("libtorch trainer: this binary was built without cgo (CGO_ENABLED=0) and cannot load the libtorch shim; rebuild it with a C compiler")

type Shim struct {
	Path         string
	TorchVersion string
	CUDADevices  int
}

func Load() (*Shim, error) { return nil, errNoCgo }

func (s *Shim) NewModel(ModelSpec) (*Model, error) { return nil, errNoCgo }

func (s *Shim) Gather(*Data, []uint64, []float32, []int64, []float32, []byte) error { return errNoCgo }

type Model struct{}

func (m *Model) Close()                                             {}
func (m *Model) Tensors() ([]TensorInfo, error)                     { return nil, errNoCgo }
func (m *Model) Attach([]byte, []uint64, bool) (bool, error)        { return false, errNoCgo }
func (m *Model) Publish() (float64, error)                          { return 0, errNoCgo }
func (m *Model) Adopt(float64, bool) (float64, error)               { return 0, errNoCgo }
func (m *Model) Norm() (float64, error)                             { return 0, errNoCgo }
func (m *Model) Forward([]float32, int, []float32) ([]int64, error) { return nil, errNoCgo }
func (m *Model) Save(string, string) error                          { return errNoCgo }
func (m *Model) Load(string, string) error                          { return errNoCgo }
func (m *Model) Export(string) error                                { return errNoCgo }
func (m *Model) EpochEnd(uint64) (bool, error)                      { return false, errNoCgo }
func (m *Model) TrainStep([]float32, int, []int64, []float32, int, float64, []byte) (float64, error) {
	return 0, errNoCgo
}
func (m *Model) TrainSteps(*Data, []uint64, int, []float64, time.Duration, *int32, *int32, bool, []Step, []byte) (int, float64, error) {
	return 0, 0, errNoCgo
}
func (m *Model) Evaluate([]float32, int, []int64, []float32, int, []byte) (float64, int64, error) {
	return 0, 0, errNoCgo
}
