package pluginpkg

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/plugin"
)

// fixture is a key pair and a built package for this platform and another.
type fixture struct {
	dir      string
	pub      ed25519.PublicKey
	priv     ed25519.PrivateKey
	pkg      string
	binary   []byte
	otherKey ed25519.PublicKey
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	pubPath, keyPath, err := GenerateKey(filepath.Join(dir, "signer"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(keyPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode %v, %v; want 0600", st.Mode(), err)
	}
	if _, _, err := GenerateKey(filepath.Join(dir, "signer")); err == nil {
		t.Error("GenerateKey overwrote an existing key")
	}
	f := &fixture{dir: dir, binary: []byte("#!/bin/sh\necho median\n")}
	if f.pub, err = LoadPublicKey(pubPath); err != nil {
		t.Fatal(err)
	}
	if f.priv, err = LoadPrivateKey(keyPath); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPublicKey(keyPath); err == nil {
		t.Error("a private key file read as a public key")
	}
	f.otherKey, _, _ = ed25519.GenerateKey(nil)
	bin := filepath.Join(dir, "median")
	if err := os.WriteFile(bin, f.binary, 0o755); err != nil {
		t.Fatal(err)
	}
	f.pkg = filepath.Join(dir, "median.tar.gz")
	out, err := os.Create(f.pkg)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := Build(out, BuildOptions{
		Kind: pluginhost.Averager, Name: "median", Version: "1.2.0", Protocols: []int{1, 2},
		Binaries: map[string]string{Platform(): bin, "plan9/mips": bin}, Key: f.priv,
		Requires: []string{"python3 >= 3.9", "torch"},
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// entries reads a package's entries in order.
func entries(t *testing.T, file string) ([]*tar.Header, [][]byte) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var hdrs []*tar.Header
	var data [][]byte
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		hdrs, data = append(hdrs, h), append(data, b)
	}
}

// rewrite writes a copy of the package with edit applied to its entries.
func rewrite(t *testing.T, src, dst string, edit func(hdrs []*tar.Header, data [][]byte) ([]*tar.Header, [][]byte)) {
	t.Helper()
	hdrs, data := edit(entries(t, src))
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for i, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(data[i]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(data[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	tw.Close()
	gz.Close()
	if err := os.WriteFile(dst, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func edit(name string, fn func([]byte) []byte) func([]*tar.Header, [][]byte) ([]*tar.Header, [][]byte) {
	return func(hdrs []*tar.Header, data [][]byte) ([]*tar.Header, [][]byte) {
		for i, h := range hdrs {
			if h.Name == name || (name == "binary" && strings.HasPrefix(h.Name, "bin/")) {
				data[i] = fn(data[i])
			}
		}
		return hdrs, data
	}
}

func add(h *tar.Header, body string) func([]*tar.Header, [][]byte) ([]*tar.Header, [][]byte) {
	return func(hdrs []*tar.Header, data [][]byte) ([]*tar.Header, [][]byte) {
		return append(hdrs, h), append(data, []byte(body))
	}
}

// Package, install, and pluginhost finds the plugin with its checksum and
// lock entry; Install refuses a platform the package lacks.
func TestRoundTrip(t *testing.T) {
	f := newFixture(t)
	p, err := Open(f.pkg, f.pub)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m := p.Manifest
	if m.Kind != "averager" || m.Name != "median" || m.Version != "1.2.0" || len(m.Platforms) != 2 ||
		!slices.Equal(m.Requires, []string{"python3 >= 3.9", "torch"}) {
		t.Errorf("manifest %+v", m)
	}
	plugins := filepath.Join(f.dir, "plugins")
	lockPath := filepath.Join(f.dir, "cohort.lock.json")
	if _, err := p.Install(context.Background(), plugins, lockPath, "windows/arm64", describesAs("1.2.0")); err == nil ||
		!strings.Contains(err.Error(), "the package is for "+strings.Join(sortedPlatforms(m), ", ")+", not this platform windows/arm64") {
		t.Errorf("install for another platform: %v", err)
	}
	inst, err := p.Install(context.Background(), plugins, lockPath, Platform(), describesAs("1.2.0"))
	if err != nil {
		t.Fatal(err)
	}
	loc, err := pluginhost.Find([]string{plugins}, pluginhost.Averager, "median")
	if err != nil {
		t.Fatal(err)
	}
	if loc.Path != inst.Path || !bytes.Equal(loc.Checksum, inst.SHA256) {
		t.Errorf("found %+v, installed %+v", loc, inst)
	}
	got, err := os.ReadFile(loc.Path)
	if err != nil || !bytes.Equal(got, f.binary) {
		t.Errorf("installed binary %q, %v", got, err)
	}
	lock, err := pluginhost.LoadLock(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := lock.Entry(pluginhost.Averager, "median")
	if !ok || e.SHA256 != hex.EncodeToString(inst.SHA256) || e.Version != "1.2.0" || e.Signer != EncodePublicKey(f.pub) {
		t.Errorf("lock entry %+v, %v", e, ok)
	}
	// Installing again replaces the lines, not adds to them.
	if _, err := p.Install(context.Background(), plugins, lockPath, Platform(), describesAs("1.2")); err != nil {
		t.Fatal(err)
	}
	sums, _ := os.ReadFile(filepath.Join(plugins, pluginhost.SumsFile))
	if n := strings.Count(string(sums), "cohort-averaging-median"); n != 1 {
		t.Errorf("SHA256SUMS lists the plugin %d times:\n%s", n, sums)
	}
}

func sortedPlatforms(m Manifest) []string {
	if Platform() < "plan9/mips" {
		return []string{Platform(), "plan9/mips"}
	}
	return []string{"plan9/mips", Platform()}
}

// Every way a package can be wrong is refused by Open, before anything is
// installed.
func TestOpenRefuses(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name    string
		edit    func([]*tar.Header, [][]byte) ([]*tar.Header, [][]byte)
		key     ed25519.PublicKey
		wantErr string
		wantIs  error
	}{
		{name: "untrusted key", key: f.otherKey, wantErr: "signed by another key", wantIs: ErrSignature},
		{name: "binary changed after signing", edit: edit("binary", func(b []byte) []byte { return append(b, '#') }), wantErr: "has sha256", wantIs: ErrTampered},
		{name: "manifest changed after signing", edit: edit(ManifestFile, func(b []byte) []byte { return bytes.Replace(b, []byte("1.2.0"), []byte("9.9.9"), 1) }), wantIs: ErrTampered},
		{name: "SHA256SUMS changed after signing", edit: edit(SumsFile, func(b []byte) []byte { return append(b, '\n') }), wantIs: ErrSignature},
		{name: "bad signature", edit: edit(SigFile, func([]byte) []byte { return []byte("bm90IGEgc2lnbmF0dXJl\n") }), wantIs: ErrSignature},
		{name: "unlisted file", edit: add(&tar.Header{Name: "extra", Typeflag: tar.TypeReg, Mode: 0o644}, "x"), wantErr: "extra is not listed", wantIs: ErrTampered},
		{name: "symlink", edit: add(&tar.Header{Name: "bin/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}, ""), wantErr: "not a plain file"},
		{name: "dot-dot", edit: add(&tar.Header{Name: "../../escape", Typeflag: tar.TypeReg, Mode: 0o644}, "x"), wantErr: "not a clean relative path"},
		{name: "absolute", edit: add(&tar.Header{Name: "/tmp/escape", Typeflag: tar.TypeReg, Mode: 0o644}, "x"), wantErr: "not a clean relative path"},
		{name: "huge manifest", edit: edit(ManifestFile, func([]byte) []byte { return make([]byte, maxMetaSize+1) }), wantErr: "over the limit"},
		{name: "duplicate", edit: add(&tar.Header{Name: ManifestFile, Typeflag: tar.TypeReg, Mode: 0o644}, "{}"), wantErr: "appears twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := f.pkg
			if tc.edit != nil {
				file = filepath.Join(t.TempDir(), "edited.tar.gz")
				rewrite(t, f.pkg, file, tc.edit)
			}
			key := tc.key
			if key == nil {
				key = f.pub
			}
			p, err := Open(file, key)
			if err == nil {
				p.Close()
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), file) {
				t.Errorf("error %v, want one naming %s and containing %q", err, file, tc.wantErr)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v does not wrap %v", err, tc.wantIs)
			}
		})
	}
	if _, err := Open(filepath.Join(f.dir, "signer.pub"), f.pub); err == nil || !strings.Contains(err.Error(), "not a gzip file") {
		t.Errorf("a key file opened as a package: %v", err)
	}
}

// describesAs is InstallOptions whose binary describes itself as version v.
func describesAs(v string) InstallOptions {
	return InstallOptions{Describe: func(_ context.Context, loc pluginhost.Located) (pluginhost.Probe, error) {
		if st, err := os.Stat(loc.Path); err != nil || st.Mode().Perm()&0o100 == 0 {
			return pluginhost.Probe{}, fmt.Errorf("%s is not executable: %v", loc.Path, err)
		}
		return pluginhost.Probe{Description: plugin.Description{Name: loc.Name, Version: v}, Protocol: plugin.ProtocolVersion}, nil
	}}
}

// build writes a package of the median averager at version, its binary
// holding body, signed by key, and opens it trusting key's public half.
func build(t *testing.T, key ed25519.PrivateKey, version, body string) *Package {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "median")
	if err := os.WriteFile(bin, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "median.tar.gz")
	out, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(out, BuildOptions{Kind: pluginhost.Averager, Name: "median", Version: version, Protocols: plugin.Protocols(),
		Binaries: map[string]string{Platform(): bin}, Key: key}); err != nil {
		t.Fatal(err)
	}
	out.Close()
	p, err := Open(file, key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Install refuses what the lock says is no release of the plugin it
// accepted, and a binary that disagrees with its manifest, each with an
// error saying which and wrapping ErrRefused, and installs nothing then;
// what it accepts it pins.
func TestInstallRefuses(t *testing.T) {
	_, vendor, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	ctx := context.Background()
	type step struct {
		name    string
		pkg     *Package
		opts    InstallOptions
		wantErr string // "" installs
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"manifest's version is not the binary's", []step{
			{"0.1.0 packaged as 0.1.1", build(t, vendor, "0.1.1", "v0.1.0"), describesAs("0.1.0"),
				`the manifest says version 0.1.1, but its binary for ` + Platform() + ` describes itself as version "0.1.0": a manifest must agree with its binary`},
		}},
		{"a binary that is not a plugin", []step{
			{"not a plugin", build(t, vendor, "1.0.0", "junk"), InstallOptions{Describe: func(context.Context, pluginhost.Located) (pluginhost.Probe, error) {
				return pluginhost.Probe{}, errors.New("the handshake timed out")
			}}, "does not run as a cohort averager plugin: the handshake timed out"},
		}},
		{"another signer", []step{
			{"first", build(t, vendor, "1.0.0", "one"), describesAs("1.0.0"), ""},
			{"another key", build(t, other, "1.1.0", "two"), describesAs("1.1.0"),
				"pins averager \"median\" to the signer " + EncodePublicKey(vendor.Public().(ed25519.PublicKey)) + " (it accepted version 1.0.0 signed by it); this package is signed by " +
					EncodePublicKey(other.Public().(ed25519.PublicKey)) + ": pass --replace-signer to accept the new signer"},
			{"another key, replaced", build(t, other, "1.1.0", "two"), InstallOptions{Describe: describesAs("1.1.0").Describe, ReplaceSigner: true}, ""},
			{"the first key, no longer pinned", build(t, vendor, "1.2.0", "three"), describesAs("1.2.0"), "pass --replace-signer"},
		}},
		{"another binary, same version", []step{
			{"first", build(t, vendor, "2.0.0", "one"), describesAs("2.0.0"), ""},
			{"same binary again", build(t, vendor, "2.0.0", "one"), describesAs("2.0.0"), ""},
			{"changed binary", build(t, vendor, "2.0", "two"), describesAs("2.0"), "accepted version 2.0.0 with a binary for " + Platform() + " of sha256"},
			{"changed binary, new version", build(t, vendor, "2.0.1", "two"), describesAs("2.0.1"), ""},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			plugins, lockPath := filepath.Join(dir, "plugins"), filepath.Join(dir, "cohort.lock.json")
			for _, s := range c.steps {
				before, _ := os.ReadFile(lockPath)
				_, err := s.pkg.Install(ctx, plugins, lockPath, Platform(), s.opts)
				after, _ := os.ReadFile(lockPath)
				if s.wantErr == "" {
					if err != nil {
						t.Fatalf("%s: %v", s.name, err)
					}
					e, _ := mustLock(t, lockPath).Entry(pluginhost.Averager, "median")
					if e.Version != s.pkg.Manifest.Version || e.Signer != EncodePublicKey(s.pkg.Signer) {
						t.Errorf("%s: lock entry %+v, want version %s signed by the package's key", s.name, e, s.pkg.Manifest.Version)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), s.wantErr) || !errors.Is(err, ErrRefused) {
					t.Fatalf("%s: %v, want a refusal saying %q", s.name, err, s.wantErr)
				}
				if !bytes.Equal(before, after) {
					t.Errorf("%s: a refused install changed the lock", s.name)
				}
				t.Logf("%s: %v", s.name, err)
			}
		})
	}
}

func mustLock(t *testing.T, path string) *pluginhost.Lock {
	t.Helper()
	l, err := pluginhost.LoadLock(path)
	if err != nil || l == nil {
		t.Fatalf("lock %s: %v", path, err)
	}
	return l
}

// A requirement a terminal would misprint, an empty one, or too many are
// refused when the package is built, as Open refuses them in a manifest.
func TestBuildRefusesBadRequirements(t *testing.T) {
	f := newFixture(t)
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, f.binary, 0o755); err != nil {
		t.Fatal(err)
	}
	many := make([]string, maxRequires+1)
	for i := range many {
		many[i] = "x"
	}
	for _, req := range [][]string{{"torch\x1b[2J"}, {""}, {strings.Repeat("x", maxRequirement+1)}, many} {
		_, err := Build(io.Discard, BuildOptions{Kind: pluginhost.Trainer, Name: "pytorch", Version: "0.1.0",
			Binaries: map[string]string{Platform(): bin}, Requires: req, Key: f.priv})
		if err == nil || !strings.Contains(err.Error(), "requirement") {
			t.Errorf("requires %.40q: %v, want a refusal", req, err)
		}
	}
}
