//go:build !linux

package hostshare

import (
	"context"
	"errors"
)

// Image is a block this process holds; elsewhere than on Linux there is
// none.
type Image struct {
	Map   *Mapping
	Built bool
}

// Acquire fails: without memfd the caller loads its own copy.
func Acquire(context.Context, string, Builder) (*Image, error) { return nil, errUnsupported }

// Close does nothing.
func (*Image) Close() error { return nil }

// errUnsupported is Acquire's answer where a platform has no memfd.
var errUnsupported = errors.New("hostshare: sharing memory between processes needs Linux")
