package cudalib

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// OpenError is dlopen refusing a file: not a shared library, the wrong
// architecture, a dependency missing.
type OpenError struct {
	Path string
	// Reason is dlerror's text.
	Reason string
}

func (e *OpenError) Error() string { return "dlopen " + e.Path + ": " + e.Reason }

// SymbolError is a library that opened but lacks an entry point the plugin
// calls, e.g. an NCCL too old or a file that is some other library.
type SymbolError struct {
	Path string
	// Symbol is the first missing one; where alternatives stand for one
	// entry, all of them, joined by " or ".
	Symbol string
}

func (e *SymbolError) Error() string { return e.Path + ": missing symbol " + e.Symbol }

// Attempt is a candidate tried and why it failed.
type Attempt struct {
	Candidate
	Err error
}

// LoadError is no candidate of a library loading.
type LoadError struct {
	Library  Library
	Attempts []Attempt
}

// Error lists every candidate, one a line, with the reason it failed, then
// what to install or set.
func (e *LoadError) Error() string {
	s := e.Library.spec()
	var b strings.Builder
	fmt.Fprintf(&b, "cannot load %s; tried:", e.Library)
	for _, a := range e.Attempts {
		fmt.Fprintf(&b, "\n\t%s (%s): %s", a.Path, a.From, reason(a.Err))
	}
	fmt.Fprintf(&b, "\n%s, or set the plugin's %s setting or %s to the library or its directory",
		s.install, s.setting, s.env)
	return b.String()
}

// Unwrap gives errors.Is and errors.As every attempt's error.
func (e *LoadError) Unwrap() []error {
	errs := make([]error, len(e.Attempts))
	for i, a := range e.Attempts {
		errs[i] = a.Err
	}
	return errs
}

// reason is an attempt's failure as one line of the LoadError; the
// candidate's path is already on the line, so it is not repeated.
func reason(err error) string {
	var oe *OpenError
	var se *SymbolError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "not found"
	case errors.As(err, &oe):
		return "dlopen: " + oe.Reason
	case errors.As(err, &se):
		return "missing symbol " + se.Symbol
	}
	return err.Error()
}

// CallError is a CUDA runtime or NCCL call returning an error code.
type CallError struct {
	Func string
	Code int
	// Message is the library's text for Code (cudaGetErrorString,
	// ncclGetErrorString).
	Message string
}

func (e *CallError) Error() string { return fmt.Sprintf("%s: %s (code %d)", e.Func, e.Message, e.Code) }
