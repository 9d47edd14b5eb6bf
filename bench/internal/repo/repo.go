// Package repo finds the cohort repository a benchmark runs in, so the
// benchmarks can name the peers beside it (../shared/peers) and its build
// outputs wherever they are started from.
package repo

import (
	"errors"
	"os"
	"path/filepath"
)

// Root is the directory holding go.mod, at or above the working directory.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the cohort repository (no go.mod above the working directory)")
		}
		dir = parent
	}
}
