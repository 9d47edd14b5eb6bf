package dirs_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cohortdl/cohort/internal/dirs"
)

func TestNonEmpty(t *testing.T) {
	root := t.TempDir()
	empty := filepath.Join(root, "empty")
	full := filepath.Join(root, "full")
	file := filepath.Join(full, "state")
	for _, d := range []string{empty, full} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		want bool
	}{
		{full, true},
		{empty, false},
		{file, false}, // a file is not a directory with entries
		{filepath.Join(root, "missing"), false},
	}
	for _, c := range cases {
		if got := dirs.NonEmpty(c.path); got != c.want {
			t.Errorf("NonEmpty(%s) = %v, want %v", c.path, got, c.want)
		}
	}
}
