//go:build !(linux && cgo)

package resources

import (
	"errors"

	"github.com/hashicorp/go-hclog"
)

func openGPUs(hclog.Logger) (gpuSource, error) {
	return nil, errors.New("NVML needs a linux build with cgo")
}
