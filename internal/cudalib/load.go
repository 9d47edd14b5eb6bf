package cudalib

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// library is one opened library with its resolved entry points.
type library struct {
	lib    Library
	from   Candidate
	handle unsafe.Pointer
	// syms maps every resolved name to its address; of alternatives, only
	// the one that resolved is present.
	syms map[string]unsafe.Pointer
}

// open tries lib's candidates in order and returns the first that opens
// and has every symbol; otherwise a *LoadError listing every attempt.
func open(lib Library, o Options) (*library, error) {
	var attempts []Attempt
	for _, c := range Candidates(lib, o) {
		l, err := openCandidate(lib, c)
		if err == nil {
			return l, nil
		}
		attempts = append(attempts, Attempt{Candidate: c, Err: err})
	}
	return nil, &LoadError{Library: lib, Attempts: attempts}
}

// openCandidate opens one candidate and resolves lib's symbols in it.
func openCandidate(lib Library, c Candidate) (*library, error) {
	// A path is checked first so a missing file reads "not found" rather
	// than dlerror's wording; a bare soname has only the loader to ask.
	if strings.Contains(c.Path, "/") {
		if _, err := os.Stat(c.Path); err != nil {
			return nil, err
		}
	}
	h, err := dlOpen(c.Path)
	if err != nil {
		return nil, err
	}
	l := &library{lib: lib, from: c, handle: h, syms: map[string]unsafe.Pointer{}}
	for _, alts := range lib.spec().symbols {
		found := false
		for _, name := range alts {
			// dlerror's text for a miss only repeats the path and name.
			if p, err := dlSym(h, name); err == nil {
				l.syms[name] = p
				found = true
				break
			}
		}
		if !found {
			serr := &SymbolError{Path: c.Path, Symbol: strings.Join(alts, " or ")}
			if cerr := dlClose(h); cerr != nil {
				return nil, errors.Join(serr, fmt.Errorf("dlclose %s: %w", c.Path, cerr))
			}
			return nil, serr
		}
	}
	return l, nil
}

func (l *library) close() error {
	if l.handle == nil {
		return nil
	}
	if err := dlClose(l.handle); err != nil {
		return fmt.Errorf("dlclose %s: %w", l.from.Path, err)
	}
	l.handle = nil
	return nil
}

// sym is a resolved entry point, or an error once the library is closed.
func (l *library) sym(name string) (unsafe.Pointer, error) {
	if l.handle == nil {
		return nil, fmt.Errorf("%s: %s called after Close", l.lib, name)
	}
	return l.syms[name], nil
}

// callIntOut calls an `int f(int *out)` entry point and turns a non-zero
// result into a *CallError with the library's own text for it.
func (l *library) callIntOut(name, errorString string) (int, error) {
	fn, err := l.sym(name)
	if err != nil {
		return 0, err
	}
	code, out := callIntOut(fn)
	if code != 0 {
		return 0, &CallError{Func: name, Code: code, Message: callErrorString(l.syms[errorString], code)}
	}
	return out, nil
}

// NCCL is an opened libnccl.so.2. Its methods must not race with Close.
type NCCL struct{ l *library }

// OpenNCCL loads NCCL from the first of Candidates(LibNCCL, o) that opens
// and has every symbol the plugin calls; otherwise the error is a
// *LoadError.
func OpenNCCL(o Options) (*NCCL, error) {
	l, err := open(LibNCCL, o)
	if err != nil {
		return nil, err
	}
	return &NCCL{l}, nil
}

// Source is the candidate the library was loaded from.
func (n *NCCL) Source() Candidate { return n.l.from }

// Version asks the loaded library for its version (ncclGetVersion).
func (n *NCCL) Version() (Version, error) {
	code, err := n.l.callIntOut("ncclGetVersion", "ncclGetErrorString")
	if err != nil {
		return Version{}, err
	}
	return ncclVersion(code), nil
}

// Close unloads the library; later calls fail. It is idempotent.
func (n *NCCL) Close() error { return n.l.close() }

// Runtime is an opened CUDA runtime. Its methods must not race with Close.
type Runtime struct{ l *library }

// OpenRuntime loads the CUDA runtime from the first of
// Candidates(LibRuntime, o) that opens and has every symbol the plugin
// calls; otherwise the error is a *LoadError.
func OpenRuntime(o Options) (*Runtime, error) {
	l, err := open(LibRuntime, o)
	if err != nil {
		return nil, err
	}
	return &Runtime{l}, nil
}

// Source is the candidate the library was loaded from.
func (r *Runtime) Source() Candidate { return r.l.from }

// Version is the runtime's own version (cudaRuntimeGetVersion), not the
// driver's.
func (r *Runtime) Version() (Version, error) {
	code, err := r.l.callIntOut("cudaRuntimeGetVersion", "cudaGetErrorString")
	if err != nil {
		return Version{}, err
	}
	return runtimeVersion(code), nil
}

// DeviceCount is how many GPUs the process sees (cudaGetDeviceCount). A
// host without a GPU or driver gets the runtime's *CallError (say
// cudaErrorNoDevice or cudaErrorInsufficientDriver), not 0, so the
// message tells which.
func (r *Runtime) DeviceCount() (int, error) {
	return r.l.callIntOut("cudaGetDeviceCount", "cudaGetErrorString")
}

// Close unloads the library; later calls fail. It is idempotent.
func (r *Runtime) Close() error { return r.l.close() }

// BLAS is an opened cuBLAS. Its methods must not race with Close.
type BLAS struct{ l *library }

// OpenBLAS loads cuBLAS from the first of Candidates(LibBLAS, o) that
// opens and has every symbol the plugin calls; otherwise the error is a
// *LoadError.
func OpenBLAS(o Options) (*BLAS, error) {
	l, err := open(LibBLAS, o)
	if err != nil {
		return nil, err
	}
	return &BLAS{l}, nil
}

// Source is the candidate the library was loaded from.
func (b *BLAS) Source() Candidate { return b.l.from }

// Close unloads the library; later calls fail. It is idempotent.
func (b *BLAS) Close() error { return b.l.close() }

// Libraries are NCCL and the CUDA runtime, loaded together.
type Libraries struct {
	NCCL    *NCCL
	Runtime *Runtime
}

// Load opens both libraries. When either fails, neither stays open and the
// error joins each failure's *LoadError, so one message names every
// library missing and every place looked for it.
func Load(o Options) (*Libraries, error) {
	n, nerr := OpenNCCL(o)
	r, rerr := OpenRuntime(o)
	if nerr == nil && rerr == nil {
		return &Libraries{NCCL: n, Runtime: r}, nil
	}
	errs := []error{nerr, rerr}
	if n != nil {
		errs = append(errs, n.Close())
	}
	if r != nil {
		errs = append(errs, r.Close())
	}
	return nil, errors.Join(errs...)
}

// Close unloads both libraries.
func (l *Libraries) Close() error {
	return errors.Join(l.NCCL.Close(), l.Runtime.Close())
}
