// Package arenacheck fails a package's tests when they leave a rank arena
// behind: call it from TestMain. It is for tests only.
//
// It names the worker's arenas (core/worker, shared/arena), so it lives
// in the core layer's test helpers, from where both are imports downward;
// the helpers that need only the standard library are in
// internal/testutil.
package arenacheck

import (
	"fmt"
	"os"

	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/arena"
)

const prefix = worker.ArenaPrefix

// Run runs the tests (m.Run) and returns their exit code, or 1 when an
// arena appeared in the arena directory while they ran that this process
// owns, or whose owner is gone (a worker the tests started, killed before
// it removed its arena, and left for no later cohort process to sweep).
// Arenas of processes that still run belong to someone else's tests.
func Run(m interface{ Run() int }) int {
	before := names()
	code := m.Run()
	var leaked []string
	for name := range names() {
		if before[name] {
			continue
		}
		pid, _ := arena.Owner(name, prefix)
		if pid == os.Getpid() || arena.OwnerGone(name, prefix) {
			leaked = append(leaked, name)
		}
	}
	if len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %d arena(s) in %s: %q\n", len(leaked), arena.DefaultDir, leaked)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func names() map[string]bool {
	ents, _ := os.ReadDir(arena.DefaultDir)
	out := make(map[string]bool, len(ents))
	for _, e := range ents {
		if _, ok := arena.Owner(e.Name(), prefix); ok {
			out[e.Name()] = true
		}
	}
	return out
}
