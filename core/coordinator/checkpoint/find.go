package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ckptVersion parses a checkpoint directory name; ok is false for any
// other name.
func ckptVersion(name string) (uint64, bool) {
	s, found := strings.CutPrefix(name, ckptPrefix)
	if !found {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// LastCheckpoint returns the newest complete checkpoint in dir (a run's
// checkpoints directory): the highest-numbered ckpt-N holding meta.json.
func LastCheckpoint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("list checkpoints: %w", err)
	}
	best, found := uint64(0), ""
	for _, e := range entries {
		v, ok := ckptVersion(e.Name())
		if !ok || !e.IsDir() || (found != "" && v < best) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), MetaFile)); err != nil {
			continue
		}
		best, found = v, filepath.Join(dir, e.Name())
	}
	if found == "" {
		return "", fmt.Errorf("no complete checkpoint (a %sN directory holding %s) in %s", ckptPrefix, MetaFile, dir)
	}
	return found, nil
}

// CheckpointsDirOf is the checkpoints directory of what --resume names: a
// checkpoint's parent, a run's out directory's checkpoints directory, or
// the directory itself.
func CheckpointsDirOf(path string) string {
	if _, err := os.Stat(filepath.Join(path, MetaFile)); err == nil {
		return filepath.Dir(path)
	}
	if st, err := os.Stat(filepath.Join(path, CheckpointsDir)); err == nil && st.IsDir() {
		return filepath.Join(path, CheckpointsDir)
	}
	return path
}

// ResolveCheckpoint turns what a user passes to --resume into a complete
// checkpoint directory: a checkpoint itself, a run's out directory, or its
// checkpoints directory (the last complete one in either).
func ResolveCheckpoint(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, MetaFile)); err == nil {
		return filepath.Abs(path)
	}
	dir := path
	if st, err := os.Stat(filepath.Join(path, CheckpointsDir)); err == nil && st.IsDir() {
		dir = filepath.Join(path, CheckpointsDir)
	}
	found, err := LastCheckpoint(dir)
	if err != nil {
		return "", fmt.Errorf("resume from %s: %w", path, err)
	}
	return filepath.Abs(found)
}
