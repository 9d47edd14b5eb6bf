package conformance_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// recorder is a conformance.T that records failures instead of failing
// the test, to prove that a broken implementation fails the suite.
type recorder struct {
	log    *failures
	name   string
	parent *recorder

	mu       sync.Mutex
	failed   bool
	cleanups []func()
}

type failures struct {
	mu   sync.Mutex
	msgs []string
}

func (f *failures) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.msgs, "\n")
}

// record runs f under a fresh recorder and returns its failures.
func record(f func(conformance.T)) (failed bool, log *failures) {
	root := &recorder{log: &failures{}}
	return !root.Run("suite", f), root.log
}

func (r *recorder) Helper()             {}
func (r *recorder) Logf(string, ...any) {}

func (r *recorder) Errorf(format string, args ...any) {
	r.log.mu.Lock()
	r.log.msgs = append(r.log.msgs, r.name+": "+fmt.Sprintf(format, args...))
	r.log.mu.Unlock()
	for p := r; p != nil; p = p.parent {
		p.mu.Lock()
		p.failed = true
		p.mu.Unlock()
	}
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *recorder) TempDir() string {
	dir, err := os.MkdirTemp("", "cohort-conformance-recorder-")
	if err != nil {
		r.Fatalf("temp dir: %v", err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Run runs f in its own goroutine, as testing does, so Fatalf ends only
// f; then its cleanups, last first, each in a goroutine of its own.
func (r *recorder) Run(name string, f func(conformance.T)) bool {
	child := &recorder{log: r.log, name: r.name + "/" + name, parent: r}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(child)
	}()
	<-done
	for i := len(child.cleanups) - 1; i >= 0; i-- {
		done := make(chan struct{})
		go func() {
			defer close(done)
			child.cleanups[i]()
		}()
		<-done
	}
	return !child.Failed()
}
