package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFile writes src to a file of its own and returns its path.
func writeFile(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cohort.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Every command's --help ends with the one exit status table, and the
// README's table has the same rows.
func TestExitTableInHelpAndREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exitCodes {
		if row := fmt.Sprintf("| %d | %s |", e.code, e.meaning); !strings.Contains(string(readme), row) {
			t.Errorf("README.md lacks the row %q", row)
		}
	}
	root := newRootCommand()
	var visit func(path []string)
	visit = func(path []string) {
		r := newRootCommand()
		var out bytes.Buffer
		r.SetOut(&out)
		r.SetArgs(append(append([]string{}, path...), "--help"))
		if err := r.Execute(); err != nil {
			t.Fatalf("%q --help: %v", path, err)
		}
		if !strings.Contains(out.String(), exitTable()) {
			t.Errorf("cohort %s --help lacks the exit status table:\n%s", strings.Join(path, " "), out.String())
		}
	}
	visit(nil)
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" {
			continue
		}
		visit([]string{c.Name()})
		for _, sub := range c.Commands() {
			visit([]string{c.Name(), sub.Name()})
		}
	}
}
