// Package atomicfile replaces files so that a reader, or a machine that
// crashes, sees the old content or the new, never a mix: checkpoints, state
// files and run summaries are written through it.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
)

// An Option changes the file Write makes.
type Option func(*options)

type options struct {
	perm os.FileMode // 0: 0666 less the umask
}

// Perm gives the file these permission bits instead of those of a file
// os.Create makes (0666 less the umask, as for every other file a run
// writes): a plugin binary wants 0755, a private key 0600. They are set
// with chmod, so the umask does not narrow them.
func Perm(perm os.FileMode) Option { return func(o *options) { o.perm = perm } }

// Write replaces path with what fill writes: into a temporary file in the
// same directory, fsynced, renamed over path, and the directory fsynced so
// the rename itself survives a crash. On error nothing is left behind. The
// file's mode is that of os.Create's files unless Perm says otherwise.
func Write(path string, fill func(io.Writer) error, opts ...Option) error {
	return replace(path, opts, func(f *os.File) error {
		w := bufio.NewWriterSize(f, bufferSize)
		if err := fill(w); err != nil {
			return err
		}
		return w.Flush()
	})
}

// bufferSize is Write's buffer: the largest that is still a small
// allocation to Go's heap. A larger one (this was 1 MiB) cost each write
// its own span of the heap, a spike that a small process writing a file
// every epoch (a summary, an averager's state) carried in its resident
// memory; a write larger than the buffer goes to the file directly anyway.
const bufferSize = 32 << 10

// replace runs Write's steps, fill writing the temporary file.
func replace(path string, opts []Option, fill func(*os.File) error) (err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	dir := filepath.Dir(path)
	f, err := createTemp(dir, "."+filepath.Base(path)+".", ".tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if o.perm != 0 {
		if err = f.Chmod(o.perm); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if err = fill(f); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	return SyncDir(dir)
}

// WriteBytes replaces path with data, as Write does.
func WriteBytes(path string, data []byte, opts ...Option) error {
	return replace(path, opts, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// createTemp is os.CreateTemp with os.Create's mode (0666 less the umask)
// rather than 0600: the kernel applies the umask, which a process cannot
// read without changing it.
func createTemp(dir, prefix, suffix string) (*os.File, error) {
	for range 100 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10)+suffix)
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if !errors.Is(err, fs.ErrExist) {
			return f, err
		}
	}
	return nil, fmt.Errorf("create a temporary file in %s: too many names taken", dir)
}

// SyncDir fsyncs a directory, so that a rename or a new entry in it
// survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s for fsync: %w", dir, err)
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}
