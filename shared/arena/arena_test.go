package arena_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
)

func TestPackAlignsAndSizes(t *testing.T) {
	l, err := arena.Pack([]arena.Entry{
		{Name: "w", DType: arena.F32, Shape: []int64{3, 5}, Role: arena.Parameter},
		{Name: "b", DType: arena.BF16, Shape: []int64{7}, Role: arena.Parameter},
		{Name: "n", DType: arena.I64, Shape: []int64{}, Role: arena.Buffer},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ off, n uint64 }{{0, 60}, {64, 14}, {128, 8}}
	for i, w := range want {
		e := l.Entries[i]
		if e.Offset != w.off || e.Bytes != w.n {
			t.Errorf("entry %s: offset %d bytes %d, want %d %d", e.Name, e.Offset, e.Bytes, w.off, w.n)
		}
	}
	if l.Size != 136 {
		t.Errorf("size %d, want 136", l.Size)
	}
}

func TestValidateRefuses(t *testing.T) {
	ok := func() arena.Layout {
		l, err := arena.Pack([]arena.Entry{
			{Name: "a", DType: arena.F32, Shape: []int64{4}, Role: arena.Parameter},
			{Name: "b", DType: arena.F32, Shape: []int64{4}, Role: arena.Parameter},
		})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	cases := []struct {
		name   string
		mutate func(*arena.Layout)
		want   string
	}{
		{"overlap", func(l *arena.Layout) { l.Entries[1].Offset = 8 }, "overlaps"},
		{"does not fit", func(l *arena.Layout) { l.Size = 70 }, "do not fit"},
		{"offset past end", func(l *arena.Layout) { l.Entries[1].Offset = 1 << 62 }, "do not fit"},
		{"bytes disagree with shape", func(l *arena.Layout) { l.Entries[0].Bytes = 12 }, "needs 16"},
		{"misaligned", func(l *arena.Layout) { l.Entries[1].Offset = 66 }, "not aligned"},
		{"duplicate name", func(l *arena.Layout) { l.Entries[1].Name = "a" }, "listed twice"},
		{"empty name", func(l *arena.Layout) { l.Entries[0].Name = "" }, "empty name"},
		{"unknown dtype", func(l *arena.Layout) { l.Entries[0].DType = 99 }, "unknown dtype"},
		{"unknown role", func(l *arena.Layout) { l.Entries[0].Role = 0 }, "unknown role"},
		{"negative dim", func(l *arena.Layout) { l.Entries[0].Shape = []int64{-4} }, "negative"},
		{"shape overflow", func(l *arena.Layout) { l.Entries[0].Shape = []int64{1 << 40, 1 << 40} }, "overflows"},
		{"too large", func(l *arena.Layout) { l.Size = arena.MaxSize + 1 }, "exceeds"},
	}
	if err := ok().Validate(); err != nil {
		t.Fatalf("valid layout refused: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := ok()
			c.mutate(&l)
			err := l.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestDigestSeesEveryField(t *testing.T) {
	base := []arena.Entry{{Name: "w", DType: arena.F32, Shape: []int64{2, 3}, Role: arena.Parameter}}
	l0, _ := arena.Pack(base)
	variants := map[string]arena.Entry{
		"name":  {Name: "v", DType: arena.F32, Shape: []int64{2, 3}, Role: arena.Parameter},
		"dtype": {Name: "w", DType: arena.F64, Shape: []int64{2, 3}, Role: arena.Parameter},
		"shape": {Name: "w", DType: arena.F32, Shape: []int64{3, 2}, Role: arena.Parameter},
		"role":  {Name: "w", DType: arena.F32, Shape: []int64{2, 3}, Role: arena.Buffer},
	}
	for field, e := range variants {
		l, err := arena.Pack([]arena.Entry{e})
		if err != nil {
			t.Fatal(err)
		}
		if l.Digest() == l0.Digest() {
			t.Errorf("digest unchanged when %s differs", field)
		}
	}
	again, _ := arena.Pack(base)
	if again.Digest() != l0.Digest() {
		t.Error("digest of equal layouts differs")
	}
}

func TestOpenSharesWrites(t *testing.T) {
	l, err := arena.Pack([]arena.Entry{{Name: "w", DType: arena.F32, Shape: []int64{1024}, Role: arena.Parameter}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "a.arena")
	if err := os.WriteFile(path, make([]byte, l.Size), 0o600); err != nil {
		t.Fatal(err)
	}
	d := arena.Descriptor{Path: path, Layout: l}
	a, err := arena.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := arena.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fa, _ := a.Float32s(0)
	fb, _ := b.Float32s(0)
	fa[1023] = 2.5
	if fb[1023] != 2.5 {
		t.Fatalf("write through one mapping not seen by the other: %v", fb[1023])
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Float32s(0); err == nil {
		t.Fatal("access after Close succeeded")
	}
}

func TestOpenRefuses(t *testing.T) {
	l, _ := arena.Pack([]arena.Entry{{Name: "w", DType: arena.F32, Shape: []int64{1024}, Role: arena.Parameter}})
	short := filepath.Join(t.TempDir(), "short.arena")
	if err := os.WriteFile(short, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := l
	bad.Size = 10
	cases := []struct {
		name string
		d    arena.Descriptor
		want string
	}{
		{"file shorter than layout", arena.Descriptor{Path: short, Layout: l}, "file holds 100 bytes"},
		{"missing file", arena.Descriptor{Path: short + ".none", Layout: l}, "no such file"},
		{"invalid layout", arena.Descriptor{Path: short, Layout: bad}, "do not fit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := arena.Open(c.d)
			if err == nil {
				m.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

func TestFloat32sRefusesOtherTypes(t *testing.T) {
	l, _ := arena.Pack([]arena.Entry{{Name: "n", DType: arena.I64, Shape: []int64{2}, Role: arena.Buffer}})
	path := filepath.Join(t.TempDir(), "a.arena")
	os.WriteFile(path, make([]byte, l.Size), 0o600)
	m, err := arena.Open(arena.Descriptor{Path: path, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Float32s(0); err == nil || !strings.Contains(err.Error(), "not f32") {
		t.Fatalf("Float32s on i64 = %v", err)
	}
	if _, err := m.Tensor(5); err == nil {
		t.Fatal("Tensor(5) of 1 entry succeeded")
	}
}
