package pluginhost

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/cohortdl/cohort/shared/atomicfile"
)

// The lock file records, per plugin kind and name, the SHA-256 of the
// binary `cohort plugins install` accepted from a signed package. A
// worker finds it at the config's worker.plugin_lock (default
// cohort.lock.json beside the config file) and refuses a locked plugin
// whose binary no longer hashes to the recorded value, wherever the
// binary was found; plugins the lock does not name run as before. A
// missing lock file locks nothing. It is JSON:
//
//	{
//	  "lock_version": 1,
//	  "plugins": [
//	    {"kind": "averager", "name": "median", "version": "1.2.0",
//	     "platform": "linux/amd64", "protocols": [1, 2],
//	     "sha256": "<hex>", "signer": "<ed25519 public key, base64>"}
//	  ]
//	}

// LockVersion is the lock file format's version.
const LockVersion = 1

// MaxLockSize bounds a lock file read from disk.
const MaxLockSize = 1 << 20

// DefaultLockFile is the lock file's name when none is configured.
const DefaultLockFile = "cohort.lock.json"

// Lock is a lock file's content.
type Lock struct {
	LockVersion int         `json:"lock_version"`
	Plugins     []LockEntry `json:"plugins"`
}

// LockEntry is one accepted plugin.
type LockEntry struct {
	Kind      Kind   `json:"kind"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Platform  string `json:"platform,omitempty"`
	Protocols []int  `json:"protocols,omitempty"`
	// SHA256 is the installed binary's checksum, hex.
	SHA256 string `json:"sha256"`
	// Signer is the public key the package's signature was checked with.
	Signer string `json:"signer,omitempty"`
}

// LoadLock reads the lock file at path. A missing file is an empty lock
// (nil, nil); so is an empty path.
func LoadLock(path string) (*Lock, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read plugin lock: %w", err)
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, MaxLockSize+1))
	if err != nil {
		return nil, fmt.Errorf("read plugin lock %s: %w", path, err)
	}
	if len(src) > MaxLockSize {
		return nil, fmt.Errorf("plugin lock %s is over %d bytes", path, MaxLockSize)
	}
	var l Lock
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("plugin lock %s: %w", path, err)
	}
	if l.LockVersion != LockVersion {
		return nil, fmt.Errorf("plugin lock %s: lock_version %d, this cohort reads %d", path, l.LockVersion, LockVersion)
	}
	for i, e := range l.Plugins {
		if sum, err := hex.DecodeString(e.SHA256); err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("plugin lock %s: entry %d (%s %q): %q is not a SHA-256", path, i, e.Kind, e.Name, e.SHA256)
		}
	}
	return &l, nil
}

// Entry returns the lock's entry for kind and name, if any.
func (l *Lock) Entry(kind Kind, name string) (LockEntry, bool) {
	if l == nil {
		return LockEntry{}, false
	}
	for _, e := range l.Plugins {
		if e.Kind == kind && e.Name == name {
			return e, true
		}
	}
	return LockEntry{}, false
}

// Set records e, replacing any entry for the same kind and name.
func (l *Lock) Set(e LockEntry) {
	l.LockVersion = LockVersion
	l.Plugins = slices.DeleteFunc(l.Plugins, func(x LockEntry) bool { return x.Kind == e.Kind && x.Name == e.Name })
	l.Plugins = append(l.Plugins, e)
	slices.SortFunc(l.Plugins, func(a, b LockEntry) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name))
	})
}

// Save writes l to path, through a temporary file renamed into place.
func (l *Lock) Save(path string) error {
	l.LockVersion = LockVersion
	src, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return fmt.Errorf("write plugin lock %s: %w", path, err)
	}
	return atomicfile.WriteBytes(path, append(src, '\n'), atomicfile.Perm(0o644))
}

// Check refuses loc when the lock names it with another checksum than
// its binary's or its SHA256SUMS entry's; a nil lock admits everything.
func (l *Lock) Check(loc Located) error {
	_, err := l.checkLocked(loc)
	return err
}

// checkLocked refuses loc when the lock names its kind and name with
// another checksum than its binary's (or than its SHA256SUMS entry's),
// and returns the locked checksum, nil when the lock does not name it.
func (l *Lock) checkLocked(loc Located) ([]byte, error) {
	e, ok := l.Entry(loc.Kind, loc.Name)
	if !ok {
		return nil, nil
	}
	want, _ := hex.DecodeString(e.SHA256) // checked by LoadLock
	if loc.Checksum != nil && !bytes.Equal(loc.Checksum, want) {
		return nil, fmt.Errorf("%s plugin %q: the %s beside %s lists sha256 %x, the plugin lock accepted %s", loc.Kind, loc.Name, SumsFile, loc.Path, loc.Checksum, e.SHA256)
	}
	got, err := fileSHA256(loc.Path)
	if err != nil {
		return nil, fmt.Errorf("%s plugin %q: %w", loc.Kind, loc.Name, err)
	}
	if !bytes.Equal(got, want) {
		return nil, fmt.Errorf("%s plugin %q: %s has sha256 %x, but the plugin lock accepted %s (version %s): refusing a binary swapped since install", loc.Kind, loc.Name, loc.Path, got, e.SHA256, e.Version)
	}
	return want, nil
}

// fileSHA256 is the SHA-256 of the file at path.
func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return h.Sum(nil), nil
}
