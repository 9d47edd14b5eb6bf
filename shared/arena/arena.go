// Package arena is the parameter arena as every participant sees it: the
// layout table that says where each tensor lives in one flat little-endian
// block (names, dtypes, shapes, roles, offsets), its validation and digest,
// mapping an existing arena file into memory, and creating and removing
// the file.
//
// The rank's core creates and removes the file (Create, Owned.Remove);
// trainers and averagers open it by descriptor (Open) and read or write
// tensors in place, so parameters never cross a socket between plugins.
// docs/plugins.md ("The arena") says who writes when.
package arena

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DType is the element type of one tensor.
type DType int

// Element types an arena can hold.
const (
	F32 DType = iota + 1
	F64
	BF16
	F16
	I64
	I32
)

// Size is the bytes of one element, 0 for an unknown type.
func (d DType) Size() uint64 {
	switch d {
	case F32, I32:
		return 4
	case F64, I64:
		return 8
	case BF16, F16:
		return 2
	}
	return 0
}

// IsFloat reports whether values of d are averaged.
func (d DType) IsFloat() bool {
	switch d {
	case F32, F64, BF16, F16:
		return true
	}
	return false
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F64:
		return "f64"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I64:
		return "i64"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Role says how the averager treats a tensor.
type Role int

const (
	// Parameter tensors are averaged with the step-weighted mean.
	Parameter Role = iota + 1
	// Buffer tensors (running statistics) are averaged among ranks that
	// trained when they are floats, and stay local otherwise.
	Buffer
)

func (r Role) String() string {
	switch r {
	case Parameter:
		return "parameter"
	case Buffer:
		return "buffer"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// Entry places one tensor in the block.
type Entry struct {
	Name   string
	DType  DType
	Shape  []int64
	Offset uint64
	Bytes  uint64
	Role   Role
}

// Elements is the product of the shape, or an error when a dimension is
// negative or the product overflows.
func (e Entry) Elements() (uint64, error) {
	n := uint64(1)
	for _, d := range e.Shape {
		if d < 0 {
			return 0, fmt.Errorf("tensor %q: negative dimension %d in shape %v", e.Name, d, e.Shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 {
			return 0, fmt.Errorf("tensor %q: shape %v overflows", e.Name, e.Shape)
		}
		n = lo
	}
	return n, nil
}

// Layout is the arena's table of contents.
type Layout struct {
	Entries []Entry
	// Size is the block's length in bytes.
	Size uint64
}

// Alignment of every entry Pack places; 64 bytes keeps tensors on their own
// cache lines and satisfies every element type.
const Alignment = 64

// MaxSize bounds an arena; a layout claiming more is refused.
const MaxSize = 1 << 40

// Pack assigns offsets and sizes to entries in order, each aligned to
// Alignment, and returns the layout. Names, types and shapes are checked.
func Pack(entries []Entry) (Layout, error) {
	out := make([]Entry, len(entries))
	var off uint64
	for i, e := range entries {
		if e.DType.Size() == 0 {
			return Layout{}, fmt.Errorf("tensor %q: unknown %v", e.Name, e.DType)
		}
		n, err := e.Elements()
		if err != nil {
			return Layout{}, err
		}
		hi, nbytes := bits.Mul64(n, e.DType.Size())
		if hi != 0 || nbytes > MaxSize {
			return Layout{}, fmt.Errorf("tensor %q: %d elements of %v exceed the arena limit", e.Name, n, e.DType)
		}
		off = (off + Alignment - 1) / Alignment * Alignment
		e.Shape = append([]int64(nil), e.Shape...)
		e.Offset, e.Bytes = off, nbytes
		out[i] = e
		off += nbytes
		if off > MaxSize {
			return Layout{}, fmt.Errorf("layout of %d tensors exceeds the arena limit of %d bytes", len(entries), MaxSize)
		}
	}
	l := Layout{Entries: out, Size: off}
	return l, l.Validate()
}

// Validate refuses a layout whose entries are unnamed or repeated, of an
// unknown type, whose byte counts disagree with their shapes, that are
// misaligned for their type, that do not fit in Size, or that overlap.
func (l Layout) Validate() error {
	if l.Size > MaxSize {
		return fmt.Errorf("arena size %d exceeds the limit of %d bytes", l.Size, MaxSize)
	}
	seen := make(map[string]bool, len(l.Entries))
	order := make([]int, len(l.Entries))
	for i, e := range l.Entries {
		order[i] = i
		if e.Name == "" {
			return fmt.Errorf("entry %d: empty name", i)
		}
		if seen[e.Name] {
			return fmt.Errorf("tensor %q: listed twice", e.Name)
		}
		seen[e.Name] = true
		if e.Role != Parameter && e.Role != Buffer {
			return fmt.Errorf("tensor %q: unknown %v", e.Name, e.Role)
		}
		size := e.DType.Size()
		if size == 0 {
			return fmt.Errorf("tensor %q: unknown %v", e.Name, e.DType)
		}
		n, err := e.Elements()
		if err != nil {
			return err
		}
		if hi, want := bits.Mul64(n, size); hi != 0 || want != e.Bytes {
			return fmt.Errorf("tensor %q: %d bytes, but shape %v of %v needs %d", e.Name, e.Bytes, e.Shape, e.DType, n*size)
		}
		if e.Offset%size != 0 {
			return fmt.Errorf("tensor %q: offset %d is not aligned to its %d-byte elements", e.Name, e.Offset, size)
		}
		if e.Offset > l.Size || e.Bytes > l.Size-e.Offset {
			return fmt.Errorf("tensor %q: bytes [%d, %d) do not fit in an arena of %d bytes", e.Name, e.Offset, e.Offset+e.Bytes, l.Size)
		}
	}
	sort.Slice(order, func(a, b int) bool { return l.Entries[order[a]].Offset < l.Entries[order[b]].Offset })
	for k := 1; k < len(order); k++ {
		prev, cur := l.Entries[order[k-1]], l.Entries[order[k]]
		if prev.Bytes > 0 && cur.Bytes > 0 && prev.Offset+prev.Bytes > cur.Offset {
			return fmt.Errorf("tensor %q [%d, %d) overlaps tensor %q [%d, %d)",
				cur.Name, cur.Offset, cur.Offset+cur.Bytes, prev.Name, prev.Offset, prev.Offset+prev.Bytes)
		}
	}
	return nil
}

// Digest is a SHA-256 over names, types, shapes and roles: two ranks train
// the same model exactly when their digests match.
func (l Layout) Digest() [32]byte {
	h := sha256.New()
	var b [8]byte
	for _, e := range l.Entries {
		binary.LittleEndian.PutUint64(b[:], uint64(len(e.Name)))
		h.Write(b[:])
		h.Write([]byte(e.Name))
		binary.LittleEndian.PutUint64(b[:], uint64(e.DType)<<32|uint64(e.Role))
		h.Write(b[:])
		binary.LittleEndian.PutUint64(b[:], uint64(len(e.Shape)))
		h.Write(b[:])
		for _, d := range e.Shape {
			binary.LittleEndian.PutUint64(b[:], uint64(d))
			h.Write(b[:])
		}
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Index returns the position of the named entry, or -1.
func (l Layout) Index(name string) int {
	for i, e := range l.Entries {
		if e.Name == name {
			return i
		}
	}
	return -1
}

// Descriptor is what a plugin needs to open an arena.
type Descriptor struct {
	Path   string
	Layout Layout
	// Device, when set, is where the trainer keeps the arena's f32
	// entries instead (an averager that declared plugin.CapDeviceBlock
	// gets it): the arena's copies of them are then not kept current.
	Device *DeviceBlock
}

// Mapping is an arena mapped into this process.
type Mapping struct {
	path   string
	layout Layout
	data   []byte
}

// ErrClosed is returned by accessors of a closed mapping.
var ErrClosed = errors.New("arena mapping is closed")

// Open validates the descriptor's layout and maps the file read-write and
// shared, so writes are seen by every process that mapped it.
func Open(d Descriptor) (*Mapping, error) {
	if err := d.Layout.Validate(); err != nil {
		return nil, fmt.Errorf("open arena %s: %w", d.Path, err)
	}
	f, err := os.OpenFile(d.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open arena: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open arena %s: %w", d.Path, err)
	}
	if uint64(st.Size()) < d.Layout.Size {
		return nil, fmt.Errorf("open arena %s: file holds %d bytes, layout needs %d", d.Path, st.Size(), d.Layout.Size)
	}
	return MapFile(f, d)
}

// MapFile maps an open arena file whose size was already checked.
func MapFile(f *os.File, d Descriptor) (*Mapping, error) {
	m := &Mapping{path: d.Path, layout: d.Layout}
	if d.Layout.Size == 0 {
		m.data = []byte{}
		return m, nil
	}
	if d.Layout.Size > math.MaxInt {
		return nil, fmt.Errorf("map arena %s: %d bytes do not fit this platform", d.Path, d.Layout.Size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(d.Layout.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map arena %s (%d bytes): %w", d.Path, d.Layout.Size, err)
	}
	m.data = data
	return m, nil
}

// Path is the arena file's name.
func (m *Mapping) Path() string { return m.path }

// Layout is the table the mapping was opened with.
func (m *Mapping) Layout() Layout { return m.layout }

// Descriptor describes the mapped arena.
func (m *Mapping) Descriptor() Descriptor { return Descriptor{Path: m.path, Layout: m.layout} }

// Bytes is the whole block; nil after Close.
func (m *Mapping) Bytes() []byte { return m.data }

// Tensor is the bytes of entry i.
func (m *Mapping) Tensor(i int) ([]byte, error) {
	if m.data == nil {
		return nil, ErrClosed
	}
	if i < 0 || i >= len(m.layout.Entries) {
		return nil, fmt.Errorf("arena %s: no entry %d of %d", m.path, i, len(m.layout.Entries))
	}
	e := m.layout.Entries[i]
	return m.data[e.Offset : e.Offset+e.Bytes : e.Offset+e.Bytes], nil
}

// Float32s views entry i as float32 values; the entry must be F32.
func (m *Mapping) Float32s(i int) ([]float32, error) {
	b, err := m.Tensor(i)
	if err != nil {
		return nil, err
	}
	if e := m.layout.Entries[i]; e.DType != F32 {
		return nil, fmt.Errorf("arena %s: tensor %q is %v, not f32", m.path, e.Name, e.DType)
	}
	return AsFloat32s(b), nil
}

// AsFloat32s views b (whose length is a multiple of 4 and which is 4-byte
// aligned, as every F32 entry of a valid layout in a mapping is) as float32
// values, without copying. The arena is little-endian, as is every platform
// cohort builds for.
func AsFloat32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Close unmaps the arena; the file stays.
func (m *Mapping) Close() error {
	if m.data == nil {
		return nil
	}
	data := m.data
	m.data = nil
	if len(data) == 0 {
		return nil
	}
	if err := unix.Munmap(data); err != nil {
		return fmt.Errorf("unmap arena %s: %w", m.path, err)
	}
	return nil
}
