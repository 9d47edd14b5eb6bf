package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cohort validate reports every mistake of a file at once, each naming
// what is wrong where, and passes a good one.
func TestValidate(t *testing.T) {
	bin := cohortBinary(t)
	cases := []struct {
		name, src string
		code      int
		want      []string
	}{
		{"good", "trainer \"mock\" {}\naverager \"mock\" {}\n", 0, []string{"ok (trainer \"mock\", averager \"mock\")"}},
		{"every mistake", "run {\n  ranks = 0\n}\ntrainer \"nosuch\" {}\naverager \"mock\" {\n  version = \">= 9\"\n}\n", 1, []string{
			"cohort.hcl:2,3-8: run.ranks: must be at least 1, got 0",
			// An unknown plugin names the directories searched.
			"no executable cohort-trainer-nosuch in bin/plugins, " + filepath.Join(filepath.Dir(bin), "plugins") + " or on PATH",
			"averager plugin \"mock\" is version 1, which does not satisfy the config's constraint \">= 9\"",
		}},
		{"syntax", "run {\n  ranks = \n}\n", 1, []string{"cohort.hcl:2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "cohort.hcl")
			if err := os.WriteFile(file, []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "validate", file)
			cmd.Dir = dir
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
