package worker

import (
	"os"
	"path/filepath"
	"testing"
)

func TestResumeDir(t *testing.T) {
	cases := []struct {
		name string
		dirs map[string]bool // rank directory -> holds a file
		rank uint32
		want string // "" for an error
	}{
		{"own directory", map[string]bool{"rank-0": true, "rank-2": true}, 2, "rank-2"},
		{"lowest when own is missing", map[string]bool{"rank-3": true, "rank-1": true, "rank-10": true}, 5, "rank-1"},
		{"numeric, not lexical, order", map[string]bool{"rank-10": true, "rank-9": true}, 0, "rank-9"},
		{"own empty: an unfinished save", map[string]bool{"rank-0": true, "rank-1": false}, 1, "rank-0"},
		{"empty ones skipped", map[string]bool{"rank-0": false, "rank-4": true}, 2, "rank-4"},
		{"nothing saved", map[string]bool{"rank-0": false, "other": true}, 0, ""},
		{"not rank directories", map[string]bool{"rank-x": true, "ranks": true}, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for d, full := range tc.dirs {
				if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
				if full {
					if err := os.WriteFile(filepath.Join(root, d, "state"), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			got, err := resumeDir(root, tc.rank)
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("resumeDir = %s, want an error", got)
			case tc.want != "" && err != nil:
				t.Fatalf("resumeDir: %v", err)
			case tc.want != "" && got != filepath.Join(root, tc.want):
				t.Fatalf("resumeDir = %s, want %s", got, filepath.Join(root, tc.want))
			}
		})
	}
}
