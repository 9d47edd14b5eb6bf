package dataset

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// aligned is n zero bytes, 8-byte aligned as a mapping is.
func aligned(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), n)
}

// writeNPY writes a little-endian .npy file into dir and returns its path.
func writeNPY(t testing.TB, dir, name, descr string, shape []int, payload []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, encodeNPY(descr, shape, payload), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// imageSources are data sets of each kind an image holds: byte features
// (widened or not) with labels and a test split, float features with
// regression targets and none.
func imageSources(t testing.TB) map[string]Source {
	dir := t.TempDir()
	pix := make([]byte, 5*2*3)
	for i := range pix {
		pix[i] = byte(53 * i)
	}
	f32 := make([]byte, 0, 4*5*3)
	for i := range 5 * 3 {
		f32 = binary.LittleEndian.AppendUint32(f32, math.Float32bits(float32(i)/7-1))
	}
	tg := make([]byte, 0, 4*5*2)
	for i := range 5 * 2 {
		tg = binary.LittleEndian.AppendUint32(tg, math.Float32bits(float32(i*i)))
	}
	x := writeNPY(t, dir, "x.npy", "|u1", []int{5, 2, 3}, pix)
	y := writeNPY(t, dir, "y.npy", "|u1", []int{5}, []byte{3, 0, 9, 1, 2})
	ex := writeNPY(t, dir, "ex.npy", "|u1", []int{2, 2, 3}, pix[:12])
	ey := writeNPY(t, dir, "ey.npy", "<i8", []int{2}, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 4), 11))
	fx := writeNPY(t, dir, "fx.npy", "<f4", []int{5, 3}, f32)
	fy := writeNPY(t, dir, "fy.npy", "<f4", []int{5, 2}, tg)
	return map[string]Source{
		"bytes widened": {TrainX: x, TrainY: y, EvalX: ex, EvalY: ey, Loss: "cross_entropy", WidenMB: 1},
		"bytes kept":    {TrainX: x, TrainY: y, EvalX: ex, EvalY: ey, Loss: "cross_entropy", WidenMB: 0},
		"floats, mse":   {TrainX: fx, TrainY: fy, Loss: "mse", WidenMB: 1},
	}
}

// makeImage builds src's image as a trainer does: loaded without widening,
// widened into the image.
func makeImage(t testing.TB, src Source) ([]byte, Identity) {
	t.Helper()
	id, err := src.Identity()
	if err != nil {
		t.Fatal(err)
	}
	raw := src
	raw.WidenMB = 0
	tr, ev, err := Load(raw)
	if err != nil {
		t.Fatal(err)
	}
	img := aligned(ImageSize(tr, ev, src.WidenMB))
	WriteImage(img, id, tr, ev, src.WidenMB)
	return img, id
}

// gatherAll gathers every sample of d, in reverse order.
func gatherAll(d *Set) ([]float32, []int64, []float32) {
	idx := make([]uint64, d.N())
	for i := range idx {
		idx[i] = uint64(d.N() - 1 - i)
	}
	x := make([]float32, d.N()*d.Features())
	y := make([]int64, d.N())
	tg := make([]float32, d.N()*d.Width())
	d.Gather(idx, x, y, tg)
	return x, y, tg
}

// TestImageRoundTrip: the sets read from an image are the sets Load
// returns, down to every gathered bit, and the image widens exactly when
// Load does.
func TestImageRoundTrip(t *testing.T) {
	for name, src := range imageSources(t) {
		t.Run(name, func(t *testing.T) {
			img, id := makeImage(t, src)
			tr, ev, err := ReadImage(img, id, nil)
			if err != nil {
				t.Fatal(err)
			}
			wtr, wev, err := Load(src)
			if err != nil {
				t.Fatal(err)
			}
			if (tr.f32 != nil) != (wtr.f32 != nil) {
				t.Errorf("image features widened %v, Load's %v", tr.f32 != nil, wtr.f32 != nil)
			}
			if (ev == nil) != (wev == nil) {
				t.Fatalf("test split %v, Load's %v", ev, wev)
			}
			for _, p := range [][2]*Set{{tr, wtr}, {ev, wev}} {
				got, want := p[0], p[1]
				if want == nil {
					continue
				}
				if got.N() != want.N() || got.Features() != want.Features() || !slices.Equal(got.Shape(), want.Shape()) ||
					got.MaxLabel() != want.MaxLabel() || got.Width() != want.Width() || got.name != want.name {
					t.Fatalf("%s: %+v, want %+v", want.name, got, want)
				}
				gx, gy, gt := gatherAll(got)
				wx, wy, wt := gatherAll(want)
				if !slices.Equal(gx, wx) || !slices.Equal(gy, wy) || !slices.Equal(gt, wt) {
					t.Fatalf("%s gathers %v %v %v, want %v %v %v", want.name, gx, gy, gt, wx, wy, wt)
				}
			}
		})
	}
}

// TestReadImageRefuses: an image of other data, or one whose sizes,
// offsets or labels are wrong, is an error, never a set.
func TestReadImageRefuses(t *testing.T) {
	src := imageSources(t)["bytes kept"]
	good, id := makeImage(t, src)
	le := binary.LittleEndian
	split := func(i int) int { return imageHeader + i*imageSplit }
	cases := []struct {
		name  string
		edit  func(b []byte) []byte
		other bool // read with another identity
		want  string
	}{
		{"other data", nil, true, "other data"},
		{"magic", func(b []byte) []byte { b[0] = 'x'; return b }, false, "not a data image"},
		{"version", func(b []byte) []byte { le.PutUint32(b[8:], 9); return b }, false, "not a data image"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-8] }, false, "header says"},
		{"three splits", func(b []byte) []byte { le.PutUint32(b[12:], 3); return b }, false, "3 splits"},
		{"no samples", func(b []byte) []byte { le.PutUint64(b[split(0):], 0); return b }, false, "0 samples"},
		{"shape disagrees", func(b []byte) []byte { le.PutUint64(b[split(0)+40:], 3); return b }, false, "holds 9 features"},
		{"shape overflows", func(b []byte) []byte { le.PutUint64(b[split(0)+40:], 1<<62); return b }, false, "shape dimension"},
		{"feature kind", func(b []byte) []byte { le.PutUint32(b[split(0)+20:], 7); return b }, false, "feature kind 7"},
		{"features past the end", func(b []byte) []byte { le.PutUint64(b[split(0)+104:], uint64(len(b)-8)); return b }, false, "bytes at offset"},
		{"features misaligned", func(b []byte) []byte { le.PutUint64(b[split(0)+104:], 321); return b }, false, "bytes at offset"},
		{"features in the header", func(b []byte) []byte { le.PutUint64(b[split(0)+104:], 8); return b }, false, "bytes at offset"},
		{"many samples", func(b []byte) []byte { le.PutUint64(b[split(0):], 1<<20); return b }, false, "bytes at offset"},
		{"label out of range", func(b []byte) []byte {
			le.PutUint64(b[le.Uint64(b[split(0)+112:]):], 1<<40)
			return b
		}, false, "not a class index"},
		{"negative label", func(b []byte) []byte {
			le.PutUint64(b[le.Uint64(b[split(1)+112:])+8:], math.MaxUint64)
			return b
		}, false, "not a class index"},
		{"labels with a width", func(b []byte) []byte { le.PutUint64(b[split(0)+32:], 2); return b }, false, "width"},
		{"label kind", func(b []byte) []byte { le.PutUint32(b[split(0)+24:], 0); return b }, false, "label kind 0"},
		{"test split of other samples", func(b []byte) []byte {
			le.PutUint64(b[split(1)+8:], 3)
			le.PutUint64(b[split(1)+40:], 3)
			le.PutUint64(b[split(1)+48:], 1)
			return b
		}, false, "features per sample"},
	}
	for _, c := range cases {
		b := aligned(len(good))
		copy(b, good)
		if c.edit != nil {
			b = c.edit(b)
		}
		use := id
		if c.other {
			use[0] ^= 1
		}
		tr, ev, err := ReadImage(b, use, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, %v, %v; want an error with %q", c.name, tr, ev, err, c.want)
		}
	}
	if _, _, err := ReadImage(aligned(len(good) + 1)[1:], id, nil); err == nil {
		t.Error("an image not 8-byte aligned accepted")
	}
}

// TestIdentity: the identity follows what Load would read: the files and
// the settings that shape the sets.
func TestIdentity(t *testing.T) {
	src := imageSources(t)["bytes widened"]
	id := func(s Source) Identity {
		t.Helper()
		v, err := s.Identity()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	base := id(src)
	if id(src) != base {
		t.Fatal("the same source gives two identities")
	}
	for name, s := range map[string]Source{
		"widen":   {TrainX: src.TrainX, TrainY: src.TrainY, EvalX: src.EvalX, EvalY: src.EvalY, Loss: src.Loss, WidenMB: 2},
		"loss":    {TrainX: src.TrainX, TrainY: src.TrainY, EvalX: src.EvalX, EvalY: src.EvalY, Loss: "mse", WidenMB: 1},
		"no eval": {TrainX: src.TrainX, TrainY: src.TrainY, Loss: src.Loss, WidenMB: 1},
	} {
		if id(s) == base {
			t.Errorf("%s: same identity", name)
		}
	}
	// A file rewritten in place: same path, new contents.
	b, err := os.ReadFile(src.TrainY)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src.TrainY, b, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(src.TrainY, later, later); err != nil {
		t.Fatal(err)
	}
	if id(src) == base {
		t.Error("a rewritten label file keeps the identity")
	}
	if _, err := (Source{TrainX: src.TrainX, TrainY: filepath.Join(t.TempDir(), "gone.npy")}).Identity(); err == nil {
		t.Error("a missing file has an identity")
	}
}

func FuzzReadImage(f *testing.F) {
	for _, src := range imageSources(f) {
		img, _ := makeImage(f, src)
		f.Add(img)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var id Identity
		if len(b) >= 48 {
			copy(id[:], b[16:48])
		}
		buf := aligned(len(b))
		copy(buf, b)
		tr, ev, err := ReadImage(buf, id, nil)
		if err != nil {
			return
		}
		// Whatever it accepts gathers within bounds.
		for _, d := range []*Set{tr, ev} {
			if d != nil {
				gatherAll(d)
			}
		}
	})
}
