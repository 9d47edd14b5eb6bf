package dataset

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
)

// MaxArrayBytes bounds the payload of one decoded file (IDX or .npy): a
// header claiming more is refused before anything is read or allocated.
const MaxArrayBytes = 16 << 30

// MaxDims bounds an array's rank.
const MaxDims = 8

// elemKind is an element type of a decoded file.
type elemKind int

const (
	kindU8 elemKind = iota + 1
	kindI8
	kindBool
	kindI16
	kindU16
	kindI32
	kindU32
	kindI64
	kindU64
	kindF16
	kindF32
	kindF64
)

func (k elemKind) size() int {
	switch k {
	case kindU8, kindI8, kindBool:
		return 1
	case kindI16, kindU16, kindF16:
		return 2
	case kindI32, kindU32, kindF32:
		return 4
	case kindI64, kindU64, kindF64:
		return 8
	}
	return 0
}

func (k elemKind) isFloat() bool { return k == kindF16 || k == kindF32 || k == kindF64 }

func (k elemKind) String() string {
	switch k {
	case kindU8:
		return "uint8"
	case kindI8:
		return "int8"
	case kindBool:
		return "bool"
	case kindI16:
		return "int16"
	case kindU16:
		return "uint16"
	case kindI32:
		return "int32"
	case kindU32:
		return "uint32"
	case kindI64:
		return "int64"
	case kindU64:
		return "uint64"
	case kindF16:
		return "float16"
	case kindF32:
		return "float32"
	case kindF64:
		return "float64"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// array is a decoded file: its shape, element type and raw payload in the
// file's byte order.
type array struct {
	shape     []int
	kind      elemKind
	bigEndian bool
	raw       []byte
}

// elements is the product of the shape.
func (a *array) elements() int {
	n := 1
	for _, d := range a.shape {
		n *= d
	}
	return n
}

// payloadSize checks a shape and element size and returns the payload's
// bytes, refusing overflow and anything above MaxArrayBytes.
func payloadSize(shape []uint64, elem int) (uint64, error) {
	n := uint64(elem)
	for _, d := range shape {
		if d > MaxArrayBytes {
			return 0, fmt.Errorf("dimension %d in shape %v exceeds the limit of %d", d, shape, uint64(MaxArrayBytes))
		}
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > MaxArrayBytes {
			return 0, fmt.Errorf("shape %v of %d-byte elements exceeds the limit of %d bytes", shape, elem, uint64(MaxArrayBytes))
		}
		n = lo
	}
	return n, nil
}

// readPayload reads exactly n bytes from r and checks that nothing follows.
// known is how many bytes r holds when that is known (a plain file), or -1
// (a gzip stream): a known size is checked before anything is allocated,
// and an unknown one grows the buffer only as data actually arrives, so a
// header that lies costs nothing.
func readPayload(r io.Reader, n uint64, known int64) ([]byte, error) {
	if known >= 0 {
		switch {
		case uint64(known) < n:
			return nil, fmt.Errorf("truncated: the header announces %d bytes of data, the file holds %d", n, known)
		case uint64(known) > n:
			return nil, fmt.Errorf("%d bytes after the %d bytes of data the header announces", uint64(known)-n, n)
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("read %d bytes of data: %w", n, err)
		}
		return buf, nil
	}
	buf := make([]byte, 0, min(n, 1<<20))
	lr := io.LimitReader(r, int64(n))
	for uint64(len(buf)) < n {
		if len(buf) == cap(buf) { // grow geometrically, never past n
			nb := make([]byte, len(buf), min(2*uint64(cap(buf)), n))
			copy(nb, buf)
			buf = nb
		}
		k, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read data: %w", err)
		}
	}
	if uint64(len(buf)) < n {
		return nil, fmt.Errorf("truncated: the header announces %d bytes of data, the stream holds %d", n, len(buf))
	}
	var one [1]byte
	if k, _ := io.ReadFull(r, one[:]); k > 0 {
		return nil, fmt.Errorf("data continues after the %d bytes the header announces", n)
	}
	return buf, nil
}

// openData opens a file that may be gzip-compressed (told by its magic, not
// its name) and returns a reader of its contents and their size when known
// (-1 for gzip).
func openData(path string) (io.Reader, int64, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, nil, fmt.Errorf("%s is not a regular file", path)
	}
	br := bufio.NewReaderSize(f, 1<<16)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, 0, nil, fmt.Errorf("%s: gzip: %w", path, err)
		}
		return zr, -1, f.Close, nil
	}
	return br, st.Size(), f.Close, nil
}

// decodeFile opens path (gzipped or not) and decodes it with dec.
func decodeFile(path string, dec func(io.Reader, int64) (*array, error)) (*array, error) {
	r, size, closeFn, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	a, err := dec(r, size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// word reads element i as an unsigned or two's-complement integer of the
// array's size and byte order.
func (a *array) word(i int) uint64 {
	sz := a.kind.size()
	b := a.raw[i*sz : (i+1)*sz]
	switch sz {
	case 1:
		return uint64(b[0])
	case 2:
		if a.bigEndian {
			return uint64(binary.BigEndian.Uint16(b))
		}
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		if a.bigEndian {
			return uint64(binary.BigEndian.Uint32(b))
		}
		return uint64(binary.LittleEndian.Uint32(b))
	}
	if a.bigEndian {
		return binary.BigEndian.Uint64(b)
	}
	return binary.LittleEndian.Uint64(b)
}

// float returns element i as a float64.
func (a *array) float(i int) float64 {
	w := a.word(i)
	switch a.kind {
	case kindU8, kindU16, kindU32, kindU64:
		return float64(w)
	case kindBool:
		if w != 0 {
			return 1
		}
		return 0
	case kindI8:
		return float64(int8(w))
	case kindI16:
		return float64(int16(w))
	case kindI32:
		return float64(int32(w))
	case kindI64:
		return float64(int64(w))
	case kindF16:
		return halfToFloat(uint16(w))
	case kindF32:
		return float64(math.Float32frombits(uint32(w)))
	}
	return math.Float64frombits(w)
}

// integer returns element i as an int64; ok is false for a float element or
// an unsigned value above MaxInt64.
func (a *array) integer(i int) (int64, bool) {
	w := a.word(i)
	switch a.kind {
	case kindU8, kindU16, kindU32, kindBool:
		return int64(w), true
	case kindU64:
		return int64(w), w <= math.MaxInt64
	case kindI8:
		return int64(int8(w)), true
	case kindI16:
		return int64(int16(w)), true
	case kindI32:
		return int64(int32(w)), true
	case kindI64:
		return int64(w), true
	}
	return 0, false
}

// halfToFloat converts an IEEE 754 binary16 value.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	frac := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1+frac/1024, exp-15)
}

var errNoSamples = errors.New("holds no samples")
