//go:build !cgo

package cudalib

import (
	"errors"
	"unsafe"
)

// Without cgo there is no dlopen: the package builds (so `go build ./...`
// and `go vet ./...` pass with CGO_ENABLED=0) and every open fails saying
// why, which then shows on each attempt of the LoadError.
const noCgo = "this binary was built without cgo (CGO_ENABLED=0) and cannot dlopen; rebuild it with a C compiler"

func dlOpen(string) (unsafe.Pointer, error) { return nil, errors.New(noCgo) }

func dlSym(unsafe.Pointer, string) (unsafe.Pointer, error) { return nil, errors.New(noCgo) }

func dlClose(unsafe.Pointer) error { return errors.New(noCgo) }

func callIntOut(unsafe.Pointer) (code, out int) { return -1, 0 }

func callErrorString(unsafe.Pointer, int) string { return noCgo }
