package arena_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
)

func layout(t *testing.T, n int64) arena.Layout {
	t.Helper()
	l, err := arena.Pack([]arena.Entry{
		{Name: "w", DType: arena.F32, Shape: []int64{n}, Role: arena.Parameter},
		{Name: "m", DType: arena.F32, Shape: []int64{3}, Role: arena.Buffer},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestCreateDescribeOpenRemove(t *testing.T) {
	dir := t.TempDir()
	a, err := arena.Create(dir, "cohort-r0", layout(t, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(a.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("arena mode %v, want 0600", st.Mode().Perm())
	}
	if uint64(st.Size()) != a.Layout().Size {
		t.Errorf("file %d bytes, layout %d", st.Size(), a.Layout().Size)
	}
	if !strings.HasPrefix(st.Name(), "cohort-r0-") {
		t.Errorf("name %q does not say its owner", st.Name())
	}

	// A plugin opens it by descriptor and sees the core's writes, and the
	// core sees the plugin's.
	w, _ := a.Float32s(0)
	w[12345] = 7
	m, err := arena.Open(a.Descriptor())
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := m.Float32s(0)
	if pw[12345] != 7 {
		t.Fatalf("plugin mapping reads %v", pw[12345])
	}
	pw[0] = -1
	if w[0] != -1 {
		t.Fatalf("core mapping reads %v", w[0])
	}
	m.Close()

	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("arena file still there after Remove: %v", err)
	}
	if err := a.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestCreateUniqueNames(t *testing.T) {
	dir := t.TempDir()
	a, err := arena.Create(dir, "x", layout(t, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Remove()
	b, err := arena.Create(dir, "x", layout(t, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove()
	if a.Path() == b.Path() {
		t.Fatal("two arenas share a file")
	}
}

func TestCreateRefusesBadLayout(t *testing.T) {
	dir := t.TempDir()
	l := layout(t, 16)
	l.Entries[1].Offset = 8 // inside "w"
	if _, err := arena.Create(dir, "x", l); err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("Create with overlapping layout = %v", err)
	}
	l = layout(t, 16)
	l.Size = 32 // "m" does not fit
	if _, err := arena.Create(dir, "x", l); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("Create with short size = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("refused Create left %d files behind", len(ents))
	}
}

func TestCreateDefaultsToDevShm(t *testing.T) {
	if _, err := os.Stat(arena.DefaultDir); err != nil {
		t.Skip("no /dev/shm on this system")
	}
	a, err := arena.Create("", "cohort-test", layout(t, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Remove()
	if !strings.HasPrefix(a.Path(), arena.DefaultDir+"/") {
		t.Fatalf("arena at %s, want under %s", a.Path(), arena.DefaultDir)
	}
}
