package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/pluginpkg"
	"github.com/cohortdl/cohort/shared/plugin"
)

// cohortOut runs cohort with args and returns its exit status and its
// output, the error it failed with last.
func cohortOut(args ...string) (int, string) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err != nil {
		fmt.Fprintf(&out, "error: %v\n", err)
	}
	return exitStatus(cmd, err), out.String()
}

// copyFile copies src to dst, mode 0755, with extra bytes appended: an
// ELF binary with bytes after its end still runs, as another build of the
// same version would.
func copyFile(t *testing.T, src, dst string, extra string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, append(b, extra...), 0o755); err != nil {
		t.Fatal(err)
	}
}

// keygen, package and install, each with what they must refuse: a version
// other than the binary's Describe, an untrusted key, a silent change of
// signer, another binary under an installed version. Then a version
// constraint, a lock entry that disagrees with the binary and a swapped
// binary make `cohort plugins` fail. The averager is a real plugin
// (testdata/cohort-averaging-median, version 1.0.0), so install and
// `cohort plugins` can ask it for its Description.
func TestPluginPackageCommands(t *testing.T) {
	median := filepath.Join(filepath.Dir(cohortBinary(t)), "plugins", "cohort-averaging-median")
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
	cfg := writeConfig(">= 1.0, < 2")
	changed := filepath.Join(dir, "median-rebuilt")
	copyFile(t, median, changed, "another build")
	key, other := filepath.Join(dir, "k"), filepath.Join(dir, "other")
	pkg := func(name string) string { return filepath.Join(dir, name+".tar.gz") }
	packageArgs := func(version, k, bin, out string) []string {
		return []string{"plugins", "package", "--name", "median", "--kind", "averager", "--version", version,
			"--key", k + ".key", "--bin", pluginpkg.Platform() + "=" + bin, "-o", pkg(out)}
	}
	install := func(p, k string, more ...string) []string {
		return append([]string{"plugins", "install", pkg(p), "--trust", k + ".pub", "--config", cfg}, more...)
	}
	// A package whose manifest disagrees with its binary, as a cohort
	// that did not check them wrote it.
	mismatched := pkg("mismatched")
	f, err := os.Create(mismatched)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"version", []string{"version"}, exitCompleted, "plugin protocols 1-4\nplugin SDK github.com/cohortdl/cohort/shared@v" + plugin.SDKVersion},
		{"keygen", []string{"plugins", "keygen", "-o", key}, exitCompleted, "k.pub (public)"},
		{"keygen other", []string{"plugins", "keygen", "-o", other}, exitCompleted, ""},
		{"keygen again", []string{"plugins", "keygen", "-o", key}, exitFailed, ""},
		{"missing configured averager", []string{"plugins", "--config", cfg, "--probe-timeout", "0"}, exitFailed, "cohort-trainer-t"},
		{"package bad kind", []string{"plugins", "package", "--name", "median", "--kind", "reducer", "--version", "1.0.0", "--key", key + ".key", "-o", pkg("x")}, exitUsage, ""},
		{"package another version", packageArgs("1.0.1", key, median, "wrong"), exitFailed,
			`the manifest says version 1.0.1, but its binary for ` + pluginpkg.Platform() + ` describes itself as version "1.0.0"`},
		{"package", packageArgs("1.0.0", key, median, "median"), exitCompleted, "averager median 1.0.0 for 1 platform"},
		{"install untrusted", install("median", other), exitFailed, "signed by another key"},
		{"install", install("median", key), exitCompleted, "cohort-averaging-median"},
		{"list", []string{"plugins", "--config", cfg, "--probe-timeout", "0"}, exitCompleted, "locked 1.0.0"},
		{"package by another key", packageArgs("1.0.0", other, median, "median-other"), exitCompleted, ""},
		{"install another signer", install("median-other", other), exitFailed, "pins averager \"median\" to the signer"},
		{"install another signer, replaced", install("median-other", other, "--replace-signer"), exitCompleted, "cohort-averaging-median"},
		{"package another binary", packageArgs("1.0.0", other, changed, "changed"), exitCompleted, ""},
		{"install another binary as 1.0.0", install("changed", other), exitFailed, "a changed binary must come with a new version"},
		{"install a mismatched manifest", install("mismatched", key, "--replace-signer"), exitFailed,
			`the manifest says version 1.0.1, but its binary for ` + pluginpkg.Platform() + ` describes itself as version "1.0.0"`},
	}
	keyPriv := func() ed25519.PrivateKey {
		k, err := pluginpkg.LoadPrivateKey(key + ".key")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, s := range steps {
		if s.name == "install a mismatched manifest" {
			_, err := pluginpkg.Build(f, pluginpkg.BuildOptions{Kind: pluginhost.Averager, Name: "median", Version: "1.0.1",
				Protocols: plugin.Protocols(), Binaries: map[string]string{pluginpkg.Platform(): median}, Key: keyPriv()})
			if cerr := f.Close(); err != nil || cerr != nil {
				t.Fatal(err, cerr)
			}
		}
		code, out := cohortOut(s.args...)
		if code != s.code || !strings.Contains(out, s.out) {
			t.Fatalf("%s: cohort %q: exit %d, output\n%s\nwant exit %d and %q", s.name, s.args, code, out, s.code, s.out)
		}
		if s.code == exitFailed && s.out != "" {
			t.Logf("%s: %s", s.name, strings.TrimSpace(out))
		}
	}
	if _, err := os.Stat(filepath.Join(plugins, "cohort-averaging-median")); err != nil {
		t.Fatal(err)
	}

	// Outside the constraint, by the version the lock recorded.
	cfg = writeConfig(">= 2")
	if code, out := cohortOut("plugins", "--config", cfg, "--probe-timeout", "0"); code != exitFailed ||
		!strings.Contains(out, `is version 1.0.0, which does not satisfy the config's constraint ">= 2"`) {
		t.Errorf("constraint: exit %d, output\n%s", code, out)
	}

	// A lock entry that disagrees with what its binary says of itself, as
	// one written before install checked them: an error in the listing.
	cfg = writeConfig("")
	src, err := os.ReadFile(lock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lock, bytes.Replace(src, []byte(`"version": "1.0.0"`), []byte(`"version": "1.0.1"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := cohortOut("plugins", "--config", cfg, "--probe-timeout", "20s"); code != exitFailed ||
		!strings.Contains(out, `refused: averager plugin "median" describes itself as version "1.0.0", but the plugin lock accepted it as version 1.0.1`) {
		t.Errorf("lock mismatch: exit %d, output\n%s", code, out)
	}
	if err := os.WriteFile(lock, src, 0o644); err != nil {
		t.Fatal(err)
	}

	// A binary swapped after install, SHA256SUMS updated with it, is
	// refused by the lock.
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
