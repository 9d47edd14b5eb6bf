// Package dirs answers, in one place, a question about directories that
// several parts of cohort ask: whether one holds anything (a run's out
// directory, a checkpoint a rank saved into). It owns nothing else.
package dirs

import "os"

// NonEmpty reports whether path is a directory with at least one entry.
// A path that is missing, unreadable or not a directory is not one.
func NonEmpty(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) > 0
}
