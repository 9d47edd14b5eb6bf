package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/pluginpkg"
)

// cohortOut runs cohort with args and returns its exit status and output.
func cohortOut(args ...string) (int, string) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	return exitStatus(cmd, err), out.String()
}

// keygen, package, install with the wrong and the right key, list, then
// a swapped binary and a version constraint make `cohort plugins` fail.
func TestPluginPackageCommands(t *testing.T) {
	dir := t.TempDir()
	plugins, lock := filepath.Join(dir, "plugins"), filepath.Join(dir, "cohort.lock.json")
	if err := os.MkdirAll(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	// The configured trainer, listed in the directory's SHA256SUMS.
	trainer := []byte("#!/bin/sh\nexit 1\n")
	if err := os.WriteFile(filepath.Join(plugins, "cohort-trainer-t"), trainer, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(trainer)
	if err := pluginhost.AddSum(plugins, "cohort-trainer-t", sum[:]); err != nil {
		t.Fatal(err)
	}
	writeConfig := func(constraint string) string {
		p := filepath.Join(dir, "cohort.hcl")
		src := fmt.Sprintf("worker {\n  plugin_dir = %q\n  plugin_lock = %q\n}\ntrainer \"t\" {}\naverager \"median\" {\n  version = %q\n}\n", plugins, lock, constraint)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := writeConfig(">= 1.2, < 2")
	bin := filepath.Join(dir, "median")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 1\n#median\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(dir, "median.tar.gz")
	steps := []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"version", []string{"version"}, exitCompleted, "plugin protocols 1-3"},
		{"keygen", []string{"plugins", "keygen", "-o", filepath.Join(dir, "k")}, exitCompleted, "k.pub (public)"},
		{"keygen other", []string{"plugins", "keygen", "-o", filepath.Join(dir, "other")}, exitCompleted, ""},
		{"keygen again", []string{"plugins", "keygen", "-o", filepath.Join(dir, "k")}, exitFailed, ""},
		{"missing configured averager", []string{"plugins", "--config", cfg, "--probe-timeout", "0"}, exitFailed, "cohort-trainer-t"},
		{"package bad kind", []string{"plugins", "package", "--name", "median", "--kind", "reducer", "--version", "1.2.0", "--key", filepath.Join(dir, "k.key"), "-o", pkg}, exitUsage, ""},
		{"package", []string{"plugins", "package", "--name", "median", "--kind", "averager", "--version", "1.2.0",
			"--key", filepath.Join(dir, "k.key"), "--bin", pluginpkg.Platform() + "=" + bin, "-o", pkg}, exitCompleted, "averager median 1.2.0 for 1 platform"},
		{"install untrusted", []string{"plugins", "install", pkg, "--trust", filepath.Join(dir, "other.pub"), "--config", cfg}, exitFailed, ""},
		{"install", []string{"plugins", "install", pkg, "--trust", filepath.Join(dir, "k.pub"), "--config", cfg}, exitCompleted, "cohort-averaging-median"},
		{"list", []string{"plugins", "--config", cfg, "--probe-timeout", "0"}, exitCompleted, "locked 1.2.0"},
	}
	for _, s := range steps {
		code, out := cohortOut(s.args...)
		if code != s.code || !strings.Contains(out, s.out) {
			t.Fatalf("%s: cohort %q: exit %d, output\n%s\nwant exit %d and %q", s.name, s.args, code, out, s.code, s.out)
		}
	}
	if _, err := os.Stat(filepath.Join(plugins, "cohort-averaging-median")); err != nil {
		t.Fatal(err)
	}

	// Outside the constraint, by the version the lock recorded.
	cfg = writeConfig(">= 2")
	if code, out := cohortOut("plugins", "--config", cfg, "--probe-timeout", "0"); code != exitFailed ||
		!strings.Contains(out, `is version 1.2.0, which does not satisfy the config's constraint ">= 2"`) {
		t.Errorf("constraint: exit %d, output\n%s", code, out)
	}

	// A binary swapped after install, SHA256SUMS updated with it, is
	// refused by the lock.
	cfg = writeConfig("")
	swapped := []byte("#!/bin/sh\necho swapped\n")
	if err := os.WriteFile(filepath.Join(plugins, "cohort-averaging-median"), swapped, 0o755); err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(swapped)
	if err := pluginhost.AddSum(plugins, "cohort-averaging-median", s[:]); err != nil {
		t.Fatal(err)
	}
	if code, out := cohortOut("plugins", "--config", cfg, "--probe-timeout", "0"); code != exitFailed ||
		!strings.Contains(out, "the plugin lock accepted") {
		t.Errorf("swapped: exit %d, output\n%s", code, out)
	}
}
