//go:build !cgo

package main

import "errors"

// Without cgo the plugin cannot dlopen the shim; it builds (so `go build
// ./...` and `go vet ./...` pass with CGO_ENABLED=0) and refuses to start.

const shimABI = 1

const errBufLen = 4096

var errNoCgo = errors.New("libtorch trainer: this binary was built without cgo (CGO_ENABLED=0) and cannot load the libtorch shim; rebuild it with a C compiler")

type shim struct {
	path         string
	TorchVersion string
	CUDADevices  int
}

func loadShim() (*shim, error) { return nil, errNoCgo }

func (s *shim) newModel(modelSpec) (*model, error) { return nil, errNoCgo }

type model struct{}

func (m *model) close()                                             {}
func (m *model) tensors() ([]tensorInfo, error)                     { return nil, errNoCgo }
func (m *model) attach([]byte, []uint64, bool) (bool, error)        { return false, errNoCgo }
func (m *model) publish() (float64, error)                          { return 0, errNoCgo }
func (m *model) adopt(float64) (float64, error)                     { return 0, errNoCgo }
func (m *model) norm() (float64, error)                             { return 0, errNoCgo }
func (m *model) forward([]float32, int, []float32) ([]int64, error) { return nil, errNoCgo }
func (m *model) save(string, string) error                          { return errNoCgo }
func (m *model) load(string, string) error                          { return errNoCgo }
func (m *model) trainStep([]float32, int, []int64, []float32, int, float64, []byte) (float64, error) {
	return 0, errNoCgo
}
func (m *model) evaluate([]float32, int, []int64, []float32, int, []byte) (float64, int64, error) {
	return 0, 0, errNoCgo
}
