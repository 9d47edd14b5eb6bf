package pluginpkg

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Limits on what a package may hold; a package past them is refused.
const (
	MaxEntries   = 64
	MaxFileSize  = 1 << 30 // one binary
	MaxTotalSize = 4 << 30 // everything, uncompressed
	maxMetaSize  = 1 << 20 // manifest.json, SHA256SUMS, SHA256SUMS.sig
)

// ErrSignature is wrapped by the error for a package whose signature does
// not verify with the trusted key.
var ErrSignature = errors.New("signature does not verify with the trusted key")

// ErrTampered is wrapped by the error for a package whose files do not
// match its signed SHA256SUMS.
var ErrTampered = errors.New("package does not match its signed SHA256SUMS")

// Package is a verified package, its files extracted to a private
// temporary directory until Close.
type Package struct {
	Manifest Manifest
	Signer   ed25519.PublicKey
	tmp      string
	files    map[string]extracted
}

type extracted struct {
	path string // under tmp, a name of the installer's own
	sum  [sha256.Size]byte
}

// Open reads the package at file and verifies it against the trusted key:
// the signature over SHA256SUMS, every file against SHA256SUMS (none
// missing, none unlisted) and the manifest against the files. The caller
// closes the Package.
func Open(file string, trusted ed25519.PublicKey) (_ *Package, err error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("open plugin package: %w", err)
	}
	defer f.Close()
	tmp, err := os.MkdirTemp("", "cohort-plugin-package-")
	if err != nil {
		return nil, fmt.Errorf("open plugin package %s: %w", file, err)
	}
	p := &Package{Signer: trusted, tmp: tmp, files: map[string]extracted{}}
	defer func() {
		if err != nil {
			p.Close()
			err = fmt.Errorf("plugin package %s: %w", file, err)
		}
	}()
	if err := p.extract(f); err != nil {
		return nil, err
	}
	if err := p.verify(trusted); err != nil {
		return nil, err
	}
	return p, nil
}

// Close removes the extracted files.
func (p *Package) Close() error { return os.RemoveAll(p.tmp) }

// extract copies every entry into tmp, refusing anything but plain files
// with clean relative names within the size limits.
func (p *Package) extract(r io.Reader) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("not a gzip file: %w", err)
	}
	tr := tar.NewReader(gz)
	var total int64
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if i >= MaxEntries {
			return fmt.Errorf("more than %d entries", MaxEntries)
		}
		name := hdr.Name
		if hdr.Typeflag != tar.TypeReg {
			return fmt.Errorf("entry %q is not a plain file (type %q): links and directories are refused", name, hdr.Typeflag)
		}
		if err := checkName(name); err != nil {
			return err
		}
		if _, dup := p.files[name]; dup {
			return fmt.Errorf("entry %q appears twice", name)
		}
		limit := int64(MaxFileSize)
		if !strings.HasPrefix(name, "bin/") {
			limit = maxMetaSize
		}
		if hdr.Size < 0 || hdr.Size > limit {
			return fmt.Errorf("entry %q is %d bytes, over the limit of %d", name, hdr.Size, limit)
		}
		if total += hdr.Size; total > MaxTotalSize {
			return fmt.Errorf("entries over %d bytes in all", int64(MaxTotalSize))
		}
		dst := filepath.Join(p.tmp, strconv.Itoa(i))
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("extract %q: %w", name, err)
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(tr, hdr.Size+1))
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%d bytes where the header says %d", n, hdr.Size)
		}
		if err != nil {
			return fmt.Errorf("extract %q: %w", name, err)
		}
		e := extracted{path: dst}
		copy(e.sum[:], h.Sum(nil))
		p.files[name] = e
	}
}

// checkName refuses names that are not clean, relative and slash-separated.
func checkName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, `\`) ||
		path.Clean(name) != name || slices.Contains(strings.Split(name, "/"), "..") {
		return fmt.Errorf("entry name %q is not a clean relative path", name)
	}
	return nil
}

func (p *Package) read(name string) ([]byte, error) {
	e, ok := p.files[name]
	if !ok {
		return nil, fmt.Errorf("no %s in the package", name)
	}
	return os.ReadFile(e.path)
}

// verify checks the signature, then the checksums, then the manifest.
func (p *Package) verify(trusted ed25519.PublicKey) error {
	if len(trusted) != ed25519.PublicKeySize {
		return errors.New("no trusted key")
	}
	sums, err := p.read(SumsFile)
	if err != nil {
		return err
	}
	sigText, err := p.read(SigFile)
	if err != nil {
		return err
	}
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sigText)))
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("%s is not a base64 ed25519 signature: %w", SigFile, ErrSignature)
	}
	if !ed25519.Verify(trusted, sums, sig) {
		return fmt.Errorf("%s over %s, trusted key %s: %w (signed by another key, or SHA256SUMS changed)",
			SigFile, SumsFile, EncodePublicKey(trusted), ErrSignature)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for line := 1; sc.Scan(); line++ {
		hexsum, name, ok := strings.Cut(sc.Text(), "  ")
		want, herr := hex.DecodeString(hexsum)
		if !ok || herr != nil || len(want) != sha256.Size {
			return fmt.Errorf("%s:%d: want \"<sha256>  <file>\": %w", SumsFile, line, ErrTampered)
		}
		e, ok := p.files[name]
		if !ok || name == SumsFile || name == SigFile {
			return fmt.Errorf("%s lists %q, which the package lacks: %w", SumsFile, name, ErrTampered)
		}
		if !bytes.Equal(e.sum[:], want) {
			return fmt.Errorf("%s has sha256 %x, %s lists %s: %w", name, e.sum, SumsFile, hexsum, ErrTampered)
		}
		listed[name] = true
	}
	for name := range p.files {
		if name != SumsFile && name != SigFile && !listed[name] {
			return fmt.Errorf("%s is not listed in %s: %w", name, SumsFile, ErrTampered)
		}
	}
	mj, err := p.read(ManifestFile)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(mj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p.Manifest); err != nil {
		return fmt.Errorf("%s: %w", ManifestFile, err)
	}
	if err := p.Manifest.check(); err != nil {
		return err
	}
	for plat, file := range p.Manifest.Platforms {
		if _, ok := p.files[file]; !ok {
			return fmt.Errorf("%s names %s for %s, which the package lacks", ManifestFile, file, plat)
		}
	}
	return nil
}

// Platform is this machine's "os/arch".
func Platform() string { return runtime.GOOS + "/" + runtime.GOARCH }
