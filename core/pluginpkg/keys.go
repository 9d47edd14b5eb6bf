// Package pluginpkg owns cohort's signed plugin packages: the signing keys,
// the package format, building a package, and verifying and installing one
// into a plugin directory (with its SHA256SUMS line and plugin lock entry).
//
// A package is a gzip-compressed tar file holding
//
//	manifest.json     kind, name, version, protocols, platforms (see Manifest)
//	bin/OS_ARCH/cohort-KIND-NAME, one per platform (averagers: cohort-averaging-NAME)
//	SHA256SUMS        sha256sum lines for every other file above
//	SHA256SUMS.sig    the ed25519 signature of SHA256SUMS, base64, one line
//
// Install trusts nothing in the package before the signature checks out
// against the key the user trusts, then every file against SHA256SUMS;
// entries are plain files only, with bounded sizes and clean relative
// names, extracted under names of the installer's own.
package pluginpkg

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"strings"
)

// Key files are two lines: a header naming the key, then the raw key in
// standard base64 (an ed25519 private key is its 64-byte form, seed and
// public key; a public key is 32 bytes).
const (
	PrivateKeyHeader = "cohort plugin signing key: ed25519 private"
	PublicKeyHeader  = "cohort plugin signing key: ed25519 public"
)

// maxKeyFile bounds a key file read from disk.
const maxKeyFile = 4096

// GenerateKey writes a new key pair: prefix.key (private, mode 0600) and
// prefix.pub. It refuses to overwrite either.
func GenerateKey(prefix string) (pubPath, keyPath string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate signing key: %w", err)
	}
	keyPath, pubPath = prefix+".key", prefix+".pub"
	if err := writeNew(keyPath, encodeKey(PrivateKeyHeader, priv), 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(pubPath, encodeKey(PublicKeyHeader, pub), 0o644); err != nil {
		os.Remove(keyPath)
		return "", "", err
	}
	return pubPath, keyPath, nil
}

func encodeKey(header string, raw []byte) []byte {
	return []byte(header + "\n" + base64.StdEncoding.EncodeToString(raw) + "\n")
}

func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write key %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write key %s: %w", path, err)
	}
	return nil
}

// LoadPrivateKey reads a private key file GenerateKey wrote.
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	raw, err := readKey(path, PrivateKeyHeader, ed25519.PrivateKeySize)
	if err != nil {
		return nil, err
	}
	return ed25519.PrivateKey(raw), nil
}

// LoadPublicKey reads a public key file GenerateKey wrote.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	raw, err := readKey(path, PublicKeyHeader, ed25519.PublicKeySize)
	if err != nil {
		return nil, err
	}
	return ed25519.PublicKey(raw), nil
}

// EncodePublicKey is pub as a key file's second line, how the lock file
// names a package's signer.
func EncodePublicKey(pub ed25519.PublicKey) string {
	return base64.StdEncoding.EncodeToString(pub)
}

func readKey(path, header string, size int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w", path, err)
	}
	if len(src) > maxKeyFile {
		return nil, fmt.Errorf("key %s: over %d bytes, not a key file", path, maxKeyFile)
	}
	lines := strings.Split(strings.TrimSpace(string(bytes.ReplaceAll(src, []byte("\r\n"), []byte("\n")))), "\n")
	if len(lines) != 2 || strings.TrimSpace(lines[0]) != header {
		return nil, fmt.Errorf("key %s: want the line %q, then the key in base64", path, header)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(lines[1]))
	if err != nil || len(raw) != size {
		return nil, fmt.Errorf("key %s: the second line is not a base64 key of %d bytes", path, size)
	}
	return raw, nil
}
