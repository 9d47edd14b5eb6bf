// Package shm maps the shared memory the ranks of one host reduce through:
// the arenas of the other ranks (opened by path and checked to be the very
// file their owner announced) and host-shared segments that the first rank
// to arrive creates and the last to leave removes.
package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Region is a mapped file.
type Region struct {
	path   string
	data   []byte
	f      *os.File // held open (with a shared lock) for segments only
	remove bool
}

// Path is the mapped file's name.
func (r *Region) Path() string { return r.path }

// Bytes is the mapping; nil after Close.
func (r *Region) Bytes() []byte { return r.data }

// FileID returns the device and inode of the file at path.
func FileID(path string) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return uint64(st.Dev), st.Ino, nil
}

// MapPeer maps another rank's arena read-write and shared. The file must be
// a regular file owned by this user, be the file (dev, ino) its owner
// announced, and hold at least size bytes.
func MapPeer(path string, dev, ino, size uint64) (*Region, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open peer arena: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat peer arena %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("peer arena %s is not a regular file", path)
	case uint64(st.Dev) != dev || st.Ino != ino:
		return nil, fmt.Errorf("peer arena %s here is not the file its rank announced (device/inode %d/%d here, %d/%d there): the ranks do not share this memory", path, st.Dev, st.Ino, dev, ino)
	case int(st.Uid) != os.Getuid():
		return nil, fmt.Errorf("peer arena %s belongs to uid %d, not to this user", path, st.Uid)
	case uint64(st.Size) < size:
		return nil, fmt.Errorf("peer arena %s holds %d bytes, the layout needs %d", path, st.Size, size)
	}
	data, err := mmap(f, size)
	if err != nil {
		return nil, fmt.Errorf("map peer arena %s: %w", path, err)
	}
	return &Region{path: path, data: data}, nil
}

func mmap(f *os.File, size uint64) ([]byte, error) {
	if size == 0 {
		return []byte{}, nil
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%d bytes do not fit this platform", size)
	}
	return unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// OpenShared opens the host-shared segment dir/name of size bytes, creating
// it (zero-filled, mode 0600) if no rank of the host has yet, and maps it.
// The Region holds a shared lock on the file; Close removes the file when no
// other holder is left.
func OpenShared(dir, name string, size uint64) (*Region, error) {
	path := filepath.Join(dir, name)
	for attempt := 0; attempt < 8; attempt++ {
		f, err := openOrCreate(dir, path, size)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock segment %s: %w", path, err)
		}
		// The last holder may have removed the name between our open and
		// our lock; then the file we hold is orphaned: start again.
		var a, b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &a) != nil || unix.Stat(path, &b) != nil || a.Ino != b.Ino || a.Dev != b.Dev {
			f.Close()
			continue
		}
		if uint64(a.Size) != size {
			f.Close()
			return nil, fmt.Errorf("segment %s holds %d bytes, want %d (a stale file of another layout?)", path, a.Size, size)
		}
		data, err := mmap(f, size)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("map segment %s: %w", path, err)
		}
		return &Region{path: path, data: data, f: f, remove: true}, nil
	}
	return nil, fmt.Errorf("segment %s keeps disappearing", path)
}

func openOrCreate(dir, path string, size uint64) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil {
		return f, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open segment: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".cohort-seg-*")
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("create segment: %w", err)
	}
	if size > math.MaxInt64 {
		tmp.Close()
		return nil, fmt.Errorf("create segment: %d bytes", size)
	}
	if err := tmp.Truncate(int64(size)); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("size segment %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		tmp.Close()
		if errors.Is(err, os.ErrExist) {
			return os.OpenFile(path, os.O_RDWR, 0)
		}
		return nil, fmt.Errorf("publish segment %s: %w", path, err)
	}
	return tmp, nil
}

// Close unmaps the region; for a segment, it removes the file if this was
// its last holder.
func (r *Region) Close() error {
	var err error
	if r.data != nil && len(r.data) > 0 {
		err = unix.Munmap(r.data)
	}
	r.data = nil
	if r.f != nil {
		if r.remove && unix.Flock(int(r.f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			var a, b unix.Stat_t
			if unix.Fstat(int(r.f.Fd()), &a) == nil && unix.Stat(r.path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
				if e := os.Remove(r.path); e != nil && !errors.Is(e, os.ErrNotExist) {
					err = errors.Join(err, e)
				}
			}
		}
		err = errors.Join(err, r.f.Close())
		r.f = nil
	}
	return err
}
