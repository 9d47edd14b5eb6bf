// Package atomicfile replaces files so that a reader, or a machine that
// crashes, sees the old content or the new, never a mix: checkpoints, state
// files and run summaries are written through it.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// An Option changes the file Write makes.
type Option func(*options)

type options struct {
	perm os.FileMode
}

// Perm gives the file these permission bits instead of 0600: a plugin
// binary wants 0755, a file other users read 0644. They are set with
// chmod, so the umask does not narrow them.
func Perm(perm os.FileMode) Option { return func(o *options) { o.perm = perm } }

// Write replaces path with what fill writes: into a temporary file in the
// same directory, fsynced, renamed over path, and the directory fsynced so
// the rename itself survives a crash. On error nothing is left behind. The
// file is 0600 unless Perm says otherwise.
func Write(path string, fill func(io.Writer) error, opts ...Option) (err error) {
	o := options{perm: 0o600}
	for _, opt := range opts {
		opt(&o)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
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
	if err = f.Chmod(o.perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err = fill(w); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = w.Flush(); err != nil {
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
	return Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}, opts...)
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
