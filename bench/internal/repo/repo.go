// Package repo finds the cohort repository a benchmark runs in, so the
// benchmarks can name the peers beside it (../shared/peers) and its build
// outputs wherever they are started from.
package repo

import (
	"errors"
	"fmt"
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

// Cohort is the cohort binary at path, made absolute, or an error saying
// how to get one.
func Cohort(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("no cohort binary: %w (run make build, or name it with -cohort)", err)
	}
	return abs, nil
}

// DDPPeer is the kit's DDP peer script beside the repository at root.
func DDPPeer(root string) string {
	return filepath.Join(root, "..", "shared", "peers", "ddp_fashion_mnist.py")
}
