package arena

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultDir is where arenas live on Linux: memory, not disk.
const DefaultDir = "/dev/shm"

// Owned is an arena this process created and must remove: the rank's
// core holds one; plugins only ever Open a descriptor.
type Owned struct {
	*Mapping
}

// Create validates layout, creates a new file for it in dir (DefaultDir when
// empty) with mode 0600, sizes it and maps it. prefix names what the arena
// is for (cohort's ranks use "cohort-<run id>-r<rank>"); the name adds this
// process's pid and start time (see Sweep), so a leftover file can be
// traced to its run and its owner, and removed once that owner is gone.
func Create(dir, prefix string, layout Layout) (*Owned, error) {
	if err := layout.Validate(); err != nil {
		return nil, fmt.Errorf("create arena: %w", err)
	}
	if dir == "" {
		dir = DefaultDir
	}
	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, fmt.Errorf("create arena: random name: %w", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-%s%s", prefix, ownerTag(), hex.EncodeToString(suffix[:]), arenaExt))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create arena: %w", err)
	}
	defer f.Close()
	fail := func(err error) (*Owned, error) {
		return nil, errors.Join(err, os.Remove(path))
	}
	if err := f.Truncate(int64(layout.Size)); err != nil {
		return fail(fmt.Errorf("create arena %s: size to %d bytes: %w", path, layout.Size, err))
	}
	m, err := MapFile(f, Descriptor{Path: path, Layout: layout})
	if err != nil {
		return fail(fmt.Errorf("create arena: %w", err))
	}
	return &Owned{Mapping: m}, nil
}

// Remove unmaps the arena and deletes its file. Plugins that still map it
// keep their pages until they unmap; the name is gone at once.
func (a *Owned) Remove() error {
	path := a.Path()
	err := a.Close()
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("remove arena: %w", rerr))
	}
	return err
}
