package dataset

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// These tests and fuzz targets need no libtorch.

// encodeNPY is a version 1.0 .npy file of a little-endian array.
func encodeNPY(descr string, shape []int, payload []byte) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	tuple := strings.Join(dims, ", ")
	if len(shape) == 1 {
		tuple += ","
	}
	head := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, tuple)
	for (10+len(head)+1)%64 != 0 {
		head += " "
	}
	head += "\n"
	var b bytes.Buffer
	b.WriteString(npyMagic)
	b.Write([]byte{1, 0})
	binary.Write(&b, binary.LittleEndian, uint16(len(head)))
	b.WriteString(head)
	b.Write(payload)
	return b.Bytes()
}

func gzipBytes(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// decodeBoth decodes b as a plain file (known size) and as a gzip stream
// (unknown size), and checks that the two agree.
func decodeBoth(t *testing.T, dec func(io.Reader, int64) (*array, error), b []byte) (*array, error) {
	t.Helper()
	a, err := dec(bytes.NewReader(b), int64(len(b)))
	zr, zerr := gzip.NewReader(bytes.NewReader(gzipBytes(b)))
	if zerr != nil {
		t.Fatal(zerr)
	}
	a2, err2 := dec(zr, -1)
	if (err == nil) != (err2 == nil) {
		t.Fatalf("plain and gzip disagree: %v / %v", err, err2)
	}
	if err != nil {
		return nil, err
	}
	if !slices.Equal(a.shape, a2.shape) || a.kind != a2.kind || a.bigEndian != a2.bigEndian || !bytes.Equal(a.raw, a2.raw) {
		t.Fatalf("plain and gzip decode differently: %+v / %+v", a, a2)
	}
	if len(a.raw) != a.elements()*a.kind.size() {
		t.Fatalf("%d bytes for shape %v of %v", len(a.raw), a.shape, a.kind)
	}
	for i := range min(a.elements(), 4096) {
		_ = a.float(i)
		_, _ = a.integer(i)
	}
	return a, nil
}

func idxBytes(kind byte, dims []uint32, payload []byte) []byte {
	b := []byte{0, 0, kind, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return append(b, payload...)
}

func TestDecodeIDX(t *testing.T) {
	a, err := decodeBoth(t, decodeIDX, idxBytes(0x08, []uint32{2, 3}, []byte{0, 1, 2, 253, 254, 255}))
	if err != nil || !slices.Equal(a.shape, []int{2, 3}) || a.kind != kindU8 || a.float(5) != 255 {
		t.Fatalf("%+v %v", a, err)
	}
	f := binary.BigEndian.AppendUint32(nil, math.Float32bits(-1.5))
	f = binary.BigEndian.AppendUint32(f, math.Float32bits(3))
	if a, err := decodeBoth(t, decodeIDX, idxBytes(0x0D, []uint32{2}, f)); err != nil || a.float(0) != -1.5 || a.float(1) != 3 {
		t.Fatalf("f32: %+v %v", a, err)
	}
	if a, err := decodeBoth(t, decodeIDX, idxBytes(0x0B, []uint32{1}, []byte{0xff, 0xfe})); err != nil || a.float(0) != -2 {
		t.Fatalf("i16: %+v %v", a, err)
	}
	bad := map[string]struct {
		b    []byte
		want string
	}{
		"wrong magic":    {append([]byte{1, 2, 8, 1, 0, 0, 0, 1}, 0), "not an IDX file: magic 0x01020801"},
		"unknown type":   {idxBytes(0x07, []uint32{1}, []byte{0}), "not an IDX file"},
		"no dimensions":  {idxBytes(0x08, nil, nil), "0 dimensions"},
		"short header":   {[]byte{0, 0, 8}, "header unreadable"},
		"dims truncated": {[]byte{0, 0, 8, 2, 0, 0, 0, 1, 0}, "truncated in its 2 dimensions"},
		"truncated data": {idxBytes(0x08, []uint32{2, 3}, []byte{1, 2}), "truncated"},
		"trailing data":  {idxBytes(0x08, []uint32{1}, []byte{1, 2}), "after"},
		"huge claim":     {idxBytes(0x0E, []uint32{1 << 31, 1 << 31}, nil), "exceeds the limit"},
		"overflow":       {idxBytes(0x0E, []uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, nil), "exceeds the limit"},
		"empty":          {nil, "header unreadable"},
	}
	for name, c := range bad {
		if _, err := decodeBoth(t, decodeIDX, c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

func TestDecodeNPYNumpyFiles(t *testing.T) {
	// The seed corpus holds files numpy.save wrote.
	load := func(name string) []byte {
		raw, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzDecodeNPY", name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := parseCorpusBytes(string(raw))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return b
	}
	a, err := decodeBoth(t, decodeNPY, load("numpy-f4_3x2"))
	if err != nil || !slices.Equal(a.shape, []int{3, 2}) || a.kind != kindF32 || a.float(5) != 1.25 {
		t.Fatalf("f4: %+v %v", a, err)
	}
	if a, err := decodeBoth(t, decodeNPY, load("numpy-f8_bigendian")); err != nil || !a.bigEndian || a.float(1) != -2.25 {
		t.Fatalf(">f8: %+v %v", a, err)
	}
	if a, err := decodeBoth(t, decodeNPY, load("numpy-i8_labels")); err != nil {
		t.Fatal(err)
	} else if v, ok := a.integer(2); !ok || v != 9 {
		t.Fatalf("i8: %v %v", v, ok)
	}
	if a, err := decodeBoth(t, decodeNPY, load("numpy-f2_3")); err != nil || a.float(0) != 0.5 || a.float(1) != -1 || a.float(2) != 65504 {
		t.Fatalf("f2: %+v %v", a, err)
	}
	if a, err := decodeBoth(t, decodeNPY, load("numpy-i4_v2")); err != nil || !slices.Equal(a.shape, []int{3}) || a.float(2) != 2 {
		t.Fatalf("v2 header: %+v %v", a, err)
	}
	if a, err := decodeBoth(t, decodeNPY, load("numpy-u1_4")); err != nil || a.kind != kindU8 || a.float(3) != 255 {
		t.Fatalf("u1: %+v %v", a, err)
	}
	if a, err := decodeBoth(t, decodeNPY, load("numpy-scalar")); err != nil || len(a.shape) != 0 || a.elements() != 1 {
		t.Fatalf("scalar: %+v %v", a, err)
	}
	for name, want := range map[string]string{
		"numpy-fortran_2x2": "Fortran-ordered",
		"structured":        "structured dtypes",
		"truncated":         "truncated",
	} {
		if _, err := decodeBoth(t, decodeNPY, load(name)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
}

func TestDecodeNPYErrors(t *testing.T) {
	hdr := func(h string) []byte {
		b := []byte(npyMagic + "\x01\x00")
		b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
		return append(b, h...)
	}
	cases := map[string]struct {
		b    []byte
		want string
	}{
		"bad magic":      {[]byte("\x93NUMPX\x01\x00\x00\x00"), "not a .npy file"},
		"version 9":      {[]byte(npyMagic + "\x09\x00\x00\x00"), "format version 9.0"},
		"huge header":    {[]byte(npyMagic + "\x02\x00\xff\xff\xff\x7f"), "exceeds the limit"},
		"header cut":     {append([]byte(npyMagic+"\x01\x00\x40\x00"), "{'descr'"...), "truncated"},
		"no shape":       {hdr("{'descr': '<f4', 'fortran_order': False}"), "no \"shape\""},
		"unknown key":    {hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}"), "unexpected key"},
		"object dtype":   {hdr("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}"), "not supported"},
		"complex dtype":  {hdr("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}"), "not supported"},
		"bad tuple":      {hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1;)}"), "want ',' or ')'"},
		"negative dim":   {hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), "want a dimension"},
		"huge shape":     {hdr("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"), "exceeds the limit"},
		"nine dims":      {hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}"), "more than 8"},
		"junk after":     {hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (0,)} x"), "after the header"},
		"repeated key":   {hdr("{'descr': '<f4', 'descr': '<f4'}"), "twice"},
		"trailing bytes": {append(hdr("{'descr': '|u1', 'fortran_order': False, 'shape': (1,)}"), 1, 2), "after"},
	}
	for name, c := range cases {
		if _, err := decodeBoth(t, decodeNPY, c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

func TestNewDataset(t *testing.T) {
	x := &array{shape: []int{2, 2, 2}, kind: kindU8, raw: []byte{0, 255, 51, 102, 1, 2, 3, 4}}
	y := &array{shape: []int{2}, kind: kindU8, raw: []byte{1, 7}}
	d, err := newDataset("train", x, y, "x", "y", "cross_entropy")
	if err != nil || d.n != 2 || d.features != 4 || !slices.Equal(d.shape, []int64{2, 2}) || d.maxLabel != 7 {
		t.Fatalf("%+v %v", d, err)
	}
	xb := make([]float32, 8)
	yb := make([]int64, 2)
	d.Gather([]uint64{0, 1}, xb, yb, nil)
	if xb[1] != 1 || xb[2] != float32(51)/255 || yb[1] != 7 {
		t.Fatalf("gather %v %v", xb, yb)
	}
	if _, err := newDataset("train", x, &array{shape: []int{3}, kind: kindU8, raw: []byte{1, 2, 3}}, "x", "y", "cross_entropy"); err == nil {
		t.Fatal("3 labels for 2 samples accepted")
	}
	neg := &array{shape: []int{2}, kind: kindI8, raw: []byte{1, 0xff}}
	if _, err := newDataset("train", x, neg, "x", "y", "cross_entropy"); err == nil || !strings.Contains(err.Error(), "not a class index") {
		t.Fatalf("a negative label: %v", err)
	}
	nan := &array{shape: []int{1, 1}, kind: kindF32, raw: binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(math.NaN())))}
	if _, err := newDataset("train", nan, &array{shape: []int{1}, kind: kindU8, raw: []byte{0}}, "x", "y", "cross_entropy"); err == nil {
		t.Fatal("a NaN feature accepted")
	}
	d, err = newDataset("train", x, &array{shape: []int{2, 1}, kind: kindU8, raw: []byte{1, 2}}, "x", "y", "mse")
	if err != nil || d.width != 1 || d.targets[1] != 2 {
		t.Fatalf("mse targets: %+v %v", d, err)
	}
}

// parseCorpusBytes reads a `go test fuzz v1` file holding one []byte.
func parseCorpusBytes(s string) ([]byte, error) {
	s = strings.TrimPrefix(s, "go test fuzz v1\n")
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "[]byte(")
	s = strings.TrimSuffix(s, ")")
	v, err := strconv.Unquote(s)
	return []byte(v), err
}

func FuzzDecodeIDX(f *testing.F) {
	f.Add(idxBytes(0x08, []uint32{2, 2}, []byte{1, 2, 3, 4}))
	f.Add(idxBytes(0x0C, []uint32{1}, []byte{0, 0, 0, 9}))
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeBoth(t, decodeIDX, b)
	})
}

func FuzzDecodeNPY(f *testing.F) {
	f.Add(encodeNPY("<f4", []int{2}, make([]byte, 8)))
	f.Add(encodeNPY("|u1", []int{2, 2}, []byte{1, 2, 3, 4}))
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeBoth(t, decodeNPY, b)
	})
}

// TestScaleRow: the unrolled byte scaling agrees with u8Scale element by
// element at every length around its stride of eight, tail included.
func TestScaleRow(t *testing.T) {
	for n := range 27 {
		src := make([]uint8, n)
		for i := range src {
			src[i] = uint8(37*i + n)
		}
		row := make([]float32, n+1)
		row[n] = -1 // past the row: untouched
		scaleRow(row, src)
		for i, v := range src {
			if row[i] != u8Scale[v] {
				t.Fatalf("length %d: element %d is %v, want %v", n, i, row[i], u8Scale[v])
			}
		}
		if row[n] != -1 {
			t.Fatalf("length %d: wrote past the row", n)
		}
	}
}

// TestWidenWithin: byte features widen to float32 only within the limit,
// and a widened set gathers the very floats the bytes did.
func TestWidenWithin(t *testing.T) {
	raw := make([]byte, 3*20)
	for i := range raw {
		raw[i] = byte(41 * i)
	}
	load := func() *Set {
		d, err := newDataset("train", &array{shape: []int{3, 20}, kind: kindU8, raw: raw},
			&array{shape: []int{3}, kind: kindU8, raw: []byte{0, 1, 2}}, "x", "y", "cross_entropy")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	gather := func(d *Set) []float32 {
		x := make([]float32, 3*20)
		d.Gather([]uint64{2, 0, 1}, x, make([]int64, 3), nil)
		return x
	}
	want := gather(load())
	for _, tc := range []struct {
		limit int64
		wide  bool
	}{{0, false}, {3*20*4 - 1, false}, {3 * 20 * 4, true}, {1 << 20, true}} {
		d := load()
		d.widenWithin(tc.limit)
		if (d.f32 != nil) != tc.wide || (d.u8 == nil) != tc.wide {
			t.Fatalf("limit %d: widened %v, want %v", tc.limit, d.f32 != nil, tc.wide)
		}
		if got := gather(d); !slices.Equal(got, want) {
			t.Fatalf("limit %d: gathered %v, want %v", tc.limit, got, want)
		}
	}
}
