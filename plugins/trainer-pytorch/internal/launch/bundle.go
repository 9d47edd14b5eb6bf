package launch

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Bundle zips the files of each tree (paths kept as they are in it) into
// one archive the interpreter runs: its __main__.py is the entry point.
func Bundle(trees ...fs.FS) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, tree := range trees {
		err := fs.WalkDir(tree, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := fs.ReadFile(tree, path)
			if err != nil {
				return err
			}
			w, err := zw.Create(path)
			if err != nil {
				return err
			}
			_, err = w.Write(data)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("bundle the Python code: %w", err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("bundle the Python code: %w", err)
	}
	return buf.Bytes(), nil
}

// MemFile is data in an anonymous in-memory file that the exec'd
// interpreter inherits and reads as /proc/self/fd/N: it leaves nothing on
// disk and goes with the process however it ends.
func MemFile(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, 0) // no CLOEXEC: the interpreter inherits it
	if err != nil {
		return nil, fmt.Errorf("memfd for %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", name, err)
	}
	return f, nil
}

// Inheritable clears f's close-on-exec flag, so an exec'd program keeps it.
func Inheritable(f *os.File) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("keep %s open across exec: %w", f.Name(), err)
	}
	return nil
}
