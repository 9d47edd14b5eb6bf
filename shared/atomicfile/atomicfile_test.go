package atomicfile_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cohortdl/cohort/shared/atomicfile"
)

func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "meta.json")
	for _, content := range []string{"first", "second, longer than the first"} {
		if err := atomicfile.WriteBytes(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries in the directory, want only the file", len(ents))
	}
}

// A failing writer leaves the old file as it was and no temporary behind.
func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.bin")
	if err := atomicfile.WriteBytes(path, []byte("old")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	err := atomicfile.Write(path, func(w io.Writer) error {
		w.Write([]byte("half of the new"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want the fill error", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("file holds %q after a failed write, want the old content", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries after a failed write, want 1 (no temporary left)", len(ents))
	}
}

func TestWriteIntoMissingDir(t *testing.T) {
	if err := atomicfile.WriteBytes(filepath.Join(t.TempDir(), "no", "such", "f"), nil); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

// The file gets the bits Perm names, whatever the umask, and without it
// those of os.Create (0666 less the umask), as every other file of a run;
// a replaced file takes the new bits.
func TestWritePerm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bin")
	cases := []struct {
		umask int
		opts  []atomicfile.Option
		want  os.FileMode
	}{
		{0o022, nil, 0o644},
		{0o077, nil, 0o600},
		{0o077, []atomicfile.Option{atomicfile.Perm(0o755)}, 0o755},
		{0o077, []atomicfile.Option{atomicfile.Perm(0o644)}, 0o644},
		{0o022, []atomicfile.Option{atomicfile.Perm(0o600)}, 0o600},
	}
	defer syscall.Umask(syscall.Umask(0o022))
	for _, c := range cases {
		syscall.Umask(c.umask)
		if err := atomicfile.WriteBytes(path, []byte("x"), c.opts...); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.Mode().Perm(); got != c.want {
			t.Errorf("mode %v, want %v", got, c.want)
		}
	}
}
