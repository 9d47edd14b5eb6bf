package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// CheckSettings refuses what Configure would, each problem at its key,
// without running the user's file: a missing or unparsable file, a bad
// value, an unknown or missing key; a good block has no problems.
func TestCheckSettings(t *testing.T) {
	small, _ := filepath.Abs("testdata/small.py")
	syntax, _ := filepath.Abs("testdata/syntax.py")
	raises, _ := filepath.Abs("testdata/raises.py") // valid Python: its error is at run time
	tr, err := conformance.TrainerBinary(buildPlugin(t))(conformance.Testing(t))
	if err != nil {
		t.Fatal(err)
	}
	checker, ok := tr.(plugin.SettingsChecker)
	if !ok {
		t.Fatalf("the host's trainer client %T has no CheckSettings", tr)
	}
	for _, tc := range []struct {
		name     string
		settings []byte
		want     map[string]string // key -> part of its message
	}{
		{"good", settings(t, map[string]any{"file": small, "batch_size": 8, "args": map[string]any{"lr": 0.1}}), nil},
		{"runs nothing", settings(t, map[string]any{"file": raises}), nil},
		{"no such file", settings(t, map[string]any{"file": filepath.Join(t.TempDir(), "gone.py")}), map[string]string{"file": "gone.py: no such file"}},
		{"not Python", settings(t, map[string]any{"file": syntax}), map[string]string{"file": "syntax.py:4: "}},
		{"bad values", settings(t, map[string]any{"file": syntax, "batch_size": -1, "threads": "four", "lr": 1}),
			map[string]string{"batch_size": "non-negative integer, got -1", "threads": `got "four"`, "lr": "unknown key", "file": "syntax.py:4: "}},
		{"no file", settings(t, map[string]any{}), map[string]string{"file": "required"}},
		{"not an object", []byte(`[1]`), map[string]string{"": "want an object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			problems, err := checker.CheckSettings(ctx, tc.settings)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, p := range problems {
				got[p.Key] = p.Message
			}
			if len(got) != len(tc.want) {
				t.Errorf("problems %+v, want one at each of %v", problems, tc.want)
			}
			for k, part := range tc.want {
				if !strings.Contains(got[k], part) {
					t.Errorf("problem at %q: %q, want it to say %q", k, got[k], part)
				}
			}
		})
	}
}
