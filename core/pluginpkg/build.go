package pluginpkg

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-version"

	"github.com/cohortdl/cohort/core/pluginhost"
)

// The fixed names inside a package.
const (
	ManifestFile = "manifest.json"
	SumsFile     = "SHA256SUMS"
	SigFile      = "SHA256SUMS.sig"
)

// FormatVersion is the manifest format's version.
const FormatVersion = 1

// Manifest describes a package.
type Manifest struct {
	Format    int    `json:"format"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Protocols []int  `json:"protocols"`
	// Platforms maps "os/arch" to the binary's path in the package,
	// bin/OS_ARCH/<binary name>.
	Platforms map[string]string `json:"platforms"`
	// Requires are what the plugin needs on the host besides its binary,
	// one requirement a line ("python3 >= 3.9", "torch"), for the people
	// installing it: cohort does not check them, the plugin does at start.
	Requires []string `json:"requires,omitempty"`
}

// Requirement limits: a manifest is read whole, so its lists are bounded.
const (
	maxRequires    = 32
	maxRequirement = 200
)

var (
	nameRe     = regexp.MustCompile(`^[a-z0-9_-]+$`)
	platformRe = regexp.MustCompile(`^[a-z0-9]+/[a-z0-9]+$`)
)

// check validates m on its own.
func (m *Manifest) check() error {
	switch {
	case m.Format != FormatVersion:
		return fmt.Errorf("manifest format %d, this cohort reads %d", m.Format, FormatVersion)
	case m.Kind != string(pluginhost.Trainer) && m.Kind != string(pluginhost.Averager):
		return fmt.Errorf("manifest kind %q is neither trainer nor averager", m.Kind)
	case !nameRe.MatchString(m.Name):
		return fmt.Errorf("manifest name %q is not a plugin name (a-z, 0-9, _ and -)", m.Name)
	case len(m.Platforms) == 0:
		return fmt.Errorf("manifest lists no platforms")
	}
	if _, err := version.NewVersion(m.Version); err != nil {
		return fmt.Errorf("manifest version %q: %w", m.Version, err)
	}
	if len(m.Requires) > maxRequires {
		return fmt.Errorf("manifest lists %d requirements, at most %d", len(m.Requires), maxRequires)
	}
	for _, r := range m.Requires {
		if r == "" || len(r) > maxRequirement || strings.ContainsFunc(r, func(c rune) bool { return c < ' ' || c == 0x7f }) {
			return fmt.Errorf("manifest requirement %q: want 1 to %d printable characters", r, maxRequirement)
		}
	}
	for _, p := range m.Protocols {
		if p < 0 {
			return fmt.Errorf("manifest protocol %d", p)
		}
	}
	bin := pluginhost.BinaryName(pluginhost.Kind(m.Kind), m.Name)
	for plat, file := range m.Platforms {
		if !platformRe.MatchString(plat) {
			return fmt.Errorf("manifest platform %q is not os/arch", plat)
		}
		if want := binPath(plat, bin); file != want {
			return fmt.Errorf("manifest platform %s names %q, want %q", plat, file, want)
		}
	}
	return nil
}

func binPath(platform, bin string) string {
	return path.Join("bin", strings.Replace(platform, "/", "_", 1), bin)
}

// BuildOptions are what Build packages.
type BuildOptions struct {
	Kind      pluginhost.Kind
	Name      string
	Version   string
	Protocols []int
	// Binaries maps "os/arch" to the binary's path on disk.
	Binaries map[string]string
	// Requires go to Manifest.Requires.
	Requires []string
	Key      ed25519.PrivateKey
}

// Build writes a signed package to w.
func Build(w io.Writer, o BuildOptions) (*Manifest, error) {
	m := &Manifest{
		Format: FormatVersion, Kind: string(o.Kind), Name: o.Name, Version: o.Version,
		Protocols: slices.Clone(o.Protocols), Platforms: map[string]string{},
		Requires: slices.Clone(o.Requires),
	}
	bin := pluginhost.BinaryName(o.Kind, o.Name)
	for plat := range o.Binaries {
		m.Platforms[plat] = binPath(plat, bin)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("package %s %q: %w", o.Kind, o.Name, err)
	}
	if len(o.Key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("package %s %q: no signing key", o.Kind, o.Name)
	}
	files := map[string][]byte{}
	mj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("package %s %q: %w", o.Kind, o.Name, err)
	}
	files[ManifestFile] = append(mj, '\n')
	for plat, src := range o.Binaries {
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("package %s %q: binary for %s: %w", o.Kind, o.Name, plat, err)
		}
		files[m.Platforms[plat]] = data
	}
	names := slices.Sorted(maps.Keys(files))
	var sums bytes.Buffer
	for _, n := range names {
		s := sha256.Sum256(files[n])
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(s[:]), n)
	}
	sig := base64.StdEncoding.EncodeToString(ed25519.Sign(o.Key, sums.Bytes())) + "\n"
	files[SumsFile], files[SigFile] = sums.Bytes(), []byte(sig)
	names = append([]string{ManifestFile, SumsFile, SigFile}, slices.DeleteFunc(names, func(n string) bool { return n == ManifestFile })...)

	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	mtime := time.Unix(0, 0)
	for _, n := range names {
		mode := int64(0o644)
		if strings.HasPrefix(n, "bin/") {
			mode = 0o755
		}
		hdr := &tar.Header{Name: n, Mode: mode, Size: int64(len(files[n])), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("package %s %q: write %s: %w", o.Kind, o.Name, n, err)
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, fmt.Errorf("package %s %q: write %s: %w", o.Kind, o.Name, n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("package %s %q: %w", o.Kind, o.Name, err)
	}
	if err := gz.Close(); err != nil {
		return nil, fmt.Errorf("package %s %q: %w", o.Kind, o.Name, err)
	}
	return m, nil
}
