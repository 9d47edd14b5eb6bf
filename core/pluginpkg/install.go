package pluginpkg

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/atomicfile"
)

// ErrRefused is wrapped by the error for a verified package that Install
// will not install over what the lock holds, or whose binary disagrees
// with its manifest.
var ErrRefused = errors.New("refused")

// Describer starts the plugin binary at loc briefly and returns what it
// says of itself: pluginhost.Host.Probe, in cohort.
type Describer func(ctx context.Context, loc pluginhost.Located) (pluginhost.Probe, error)

// InstallOptions are Install's checks.
type InstallOptions struct {
	// Describe asks the package's binary for this platform for its
	// Description; Install refuses a binary whose version is not the
	// manifest's, or that does not serve the manifest's kind. Required.
	Describe Describer
	// ReplaceSigner accepts a package signed by another key than the one
	// the lock pins for the plugin; the lock then pins the new key.
	ReplaceSigner bool
}

// Installed is what Install put where.
type Installed struct {
	Path   string
	SHA256 []byte
	Entry  pluginhost.LockEntry
}

// Install copies the binary for platform ("os/arch"; Platform() for this
// machine) into dir as the plugin's binary name, lists it in dir's
// SHA256SUMS and records it in the lock file at lockPath. First it refuses,
// with an error wrapping ErrRefused, a package the lock says is not a
// release of the plugin it accepted: signed by another key than the one
// the lock pins (unless o.ReplaceSigner), or holding another binary under
// the version the lock accepted; and a binary that does not describe
// itself as the manifest says.
func (p *Package) Install(ctx context.Context, dir, lockPath, platform string, o InstallOptions) (Installed, error) {
	m := p.Manifest
	file, ok := m.Platforms[platform]
	if !ok {
		return Installed{}, fmt.Errorf("install %s %q %s: the package is for %s, not this platform %s",
			m.Kind, m.Name, m.Version, strings.Join(slices.Sorted(maps.Keys(m.Platforms)), ", "), platform)
	}
	e := p.files[file]
	kind := pluginhost.Kind(m.Kind)
	bin := pluginhost.BinaryName(kind, m.Name)
	fail := func(err error) (Installed, error) {
		return Installed{}, fmt.Errorf("install %s %q %s: %w", m.Kind, m.Name, m.Version, err)
	}
	lock, err := pluginhost.LoadLock(lockPath)
	if err != nil {
		return fail(err)
	}
	if lock == nil {
		lock = &pluginhost.Lock{}
	}
	entry := pluginhost.LockEntry{
		Kind: kind, Name: m.Name, Version: m.Version, Platform: platform,
		Protocols: m.Protocols, SHA256: hex.EncodeToString(e.sum[:]), Signer: EncodePublicKey(p.Signer),
	}
	if old, ok := lock.Entry(kind, m.Name); ok {
		if err := p.checkAgainstLock(old, entry, lockPath, o.ReplaceSigner); err != nil {
			return fail(err)
		}
	}
	if err := p.checkDescribed(ctx, kind, e.path, e.sum[:], platform, o.Describe); err != nil {
		return fail(err)
	}

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	dst := filepath.Join(dir, bin)
	if err := copyInto(e.path, dst); err != nil {
		return fail(err)
	}
	if err := pluginhost.AddSum(dir, bin, e.sum[:]); err != nil {
		return fail(err)
	}
	lock.Set(entry)
	if err := lock.Save(lockPath); err != nil {
		return fail(err)
	}
	return Installed{Path: dst, SHA256: e.sum[:], Entry: entry}, nil
}

// checkAgainstLock refuses a package that is no release of the plugin the
// lock entry old accepted: another signer, unless replaceSigner, or
// another binary for the same platform under the same version.
func (p *Package) checkAgainstLock(old, next pluginhost.LockEntry, lockPath string, replaceSigner bool) error {
	if old.Signer != "" && old.Signer != next.Signer && !replaceSigner {
		return fmt.Errorf("the plugin lock %s pins %s %q to the signer %s (it accepted version %s signed by it); this package is signed by %s: "+
			"pass --replace-signer to accept the new signer: %w", lockPath, old.Kind, old.Name, old.Signer, old.Version, next.Signer, ErrRefused)
	}
	if pluginhost.SameVersion(old.Version, next.Version) && old.Platform == next.Platform && old.SHA256 != next.SHA256 {
		return fmt.Errorf("the plugin lock %s accepted version %s with a binary for %s of sha256 %s; this package's binary for it has sha256 %s: "+
			"a changed binary must come with a new version: %w", lockPath, old.Version, old.Platform, old.SHA256, next.SHA256, ErrRefused)
	}
	return nil
}

// checkDescribed starts the package's binary at path and refuses it when
// it does not serve the manifest's kind or describes itself with another
// version than the manifest's.
func (p *Package) checkDescribed(ctx context.Context, kind pluginhost.Kind, path string, sum []byte, platform string, describe Describer) error {
	if describe == nil {
		return errors.New("pluginpkg: InstallOptions.Describe is required")
	}
	// The extracted file is private to the installer; it runs as it is,
	// under go-plugin's checksum check.
	if err := os.Chmod(path, 0o700); err != nil {
		return err
	}
	probe, err := describe(ctx, pluginhost.Located{Kind: kind, Name: p.Manifest.Name, Path: path, Checksum: sum})
	if err != nil {
		return fmt.Errorf("its binary for %s does not run as a cohort %s plugin: %w: %w", platform, kind, err, ErrRefused)
	}
	return CheckDescribed(p.Manifest.Version, probe.Description.Version, platform)
}

// CheckDescribed refuses a binary for platform whose Describe reports
// another version than the manifest's.
func CheckDescribed(manifest, described, platform string) error {
	if !pluginhost.SameVersion(manifest, described) {
		return fmt.Errorf("the manifest says version %s, but its binary for %s describes itself as version %q: "+
			"a manifest must agree with its binary: %w", manifest, platform, described, ErrRefused)
	}
	return nil
}

// copyInto copies src to dst (mode 0755) through a temporary file renamed
// into place, so a running plugin's binary is replaced, never rewritten.
func copyInto(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.Write(dst, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	}, atomicfile.Perm(0o755))
}
