package dataset

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"unsafe"
)

// An image is the splits laid out flat in one block of memory, so that the
// ranks of a host can map one copy of it read-only (../hostshare) instead
// of each loading its own. It holds what Load would hold: the training
// features widened to float32 when Load would widen them, bytes otherwise.
// All of it is in the host's byte order: an image never leaves its host.
//
//	header   64 bytes: magic, version, split count, the Source's identity, total size
//	split    128 bytes each: samples, features, shape, kinds, width, offsets
//	data     each split's features, then its labels or targets, 64-byte aligned

const (
	imageMagic   = "cohortDS"
	imageVersion = 1
	imageHeader  = 64
	imageSplit   = 128
	imageAlign   = 64

	featU8  = 1
	featF32 = 2

	yLabels  = 1
	yTargets = 2
)

// Identity is a digest of what a Source loads: its settings and, for every
// file it reads, the file's device, inode, size and modification and change
// times. Two processes that compute the same identity load the same data,
// so one may use the other's image.
type Identity [32]byte

// Identity digests the source and the files it names; it fails where a
// file is missing (Load says what is wrong).
func (s Source) Identity() (Identity, error) {
	h := sha256.New()
	fmt.Fprintf(h, "image %d\x00loss %s\x00widen %d\x00", imageVersion, s.Loss, s.WidenMB)
	var files []string
	if s.TrainX != "" {
		files = []string{s.TrainX, s.TrainY, s.EvalX, s.EvalY}
	} else {
		for _, base := range idxNames {
			files = append(files, findIDX(s.Dir, base))
		}
		if files[0] == "" || files[1] == "" {
			return Identity{}, fmt.Errorf("data = %q: no IDX training files", s.Dir)
		}
	}
	for _, f := range files {
		if f == "" {
			fmt.Fprint(h, "none\x00")
			continue
		}
		abs, err := filepath.Abs(f)
		if err != nil {
			return Identity{}, err
		}
		st, err := os.Stat(abs)
		if err != nil {
			return Identity{}, err
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok {
			return Identity{}, fmt.Errorf("%s: no device and inode", abs)
		}
		fmt.Fprintf(h, "%s\x00%d %d %d %d.%d %d.%d\x00", abs, sys.Dev, sys.Ino, sys.Size,
			sys.Mtim.Sec, sys.Mtim.Nsec, sys.Ctim.Sec, sys.Ctim.Nsec)
	}
	var id Identity
	h.Sum(id[:0])
	return id, nil
}

// widens says whether the set's byte features are widened to float32
// when that takes at most limit bytes (as Load does).
func (d *Set) widens(limit int64) bool {
	return d.u8 != nil && int64(len(d.u8))*4 <= limit
}

// ImageSize is the size of the image WriteImage makes of the splits (eval
// may be nil).
func ImageSize(train, eval *Set, widenMB int64) int {
	end := imageHeader + 2*imageSplit
	for _, d := range []*Set{train, eval} {
		if d == nil {
			continue
		}
		fb, yb := d.imageBytes(d == train && d.widens(widenMB<<20))
		end = alignUp(end) + fb
		end = alignUp(end) + yb
	}
	return end
}

// imageBytes are the bytes of the set's features and of its labels or
// targets in an image.
func (d *Set) imageBytes(widen bool) (features, y int) {
	features = d.n * d.features * 4
	if d.u8 != nil && !widen {
		features = d.n * d.features
	}
	if d.labels != nil {
		return features, 8 * len(d.labels)
	}
	return features, 4 * len(d.targets)
}

func alignUp(n int) int { return (n + imageAlign - 1) &^ (imageAlign - 1) }

// WriteImage lays the splits out in dst, which holds ImageSize bytes and
// is 8-byte aligned, widening byte training features as Load with widenMB
// would.
func WriteImage(dst []byte, id Identity, train, eval *Set, widenMB int64) {
	le := binary.LittleEndian
	copy(dst, imageMagic)
	le.PutUint32(dst[8:], imageVersion)
	splits := 1
	if eval != nil {
		splits = 2
	}
	le.PutUint32(dst[12:], uint32(splits))
	copy(dst[16:48], id[:])
	le.PutUint64(dst[48:], uint64(len(dst)))
	end := imageHeader + 2*imageSplit
	for i, d := range []*Set{train, eval}[:splits] {
		widen := d == train && d.widens(widenMB<<20)
		fb, yb := d.imageBytes(widen)
		fOff := alignUp(end)
		yOff := alignUp(fOff + fb)
		end = yOff + yb
		h := dst[imageHeader+i*imageSplit : imageHeader+(i+1)*imageSplit]
		le.PutUint64(h[0:], uint64(d.n))
		le.PutUint64(h[8:], uint64(d.features))
		le.PutUint32(h[16:], uint32(len(d.shape)))
		kind, ykind := uint32(featF32), uint32(yTargets)
		if d.u8 != nil && !widen {
			kind = featU8
		}
		if d.labels != nil {
			ykind = yLabels
		}
		le.PutUint32(h[20:], kind)
		le.PutUint32(h[24:], ykind)
		le.PutUint64(h[32:], uint64(d.width))
		for j, v := range d.shape {
			le.PutUint64(h[40+8*j:], uint64(v))
		}
		le.PutUint64(h[104:], uint64(fOff))
		le.PutUint64(h[112:], uint64(yOff))

		feat := dst[fOff : fOff+fb]
		switch {
		case kind == featU8:
			copy(feat, d.u8)
		case d.u8 != nil:
			scaleRow(unsafe.Slice((*float32)(unsafe.Pointer(&feat[0])), len(d.u8)), d.u8)
		default:
			copy(feat, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.f32))), 4*len(d.f32)))
		}
		ys := dst[yOff : yOff+yb]
		if d.labels != nil {
			copy(ys, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.labels))), yb))
		} else {
			copy(ys, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.targets))), yb))
		}
	}
}

var errImage = errors.New("not a data image of this version")

// ReadImage returns the splits of an image that WriteImage made for id
// (eval is nil when it holds none). The features stay in src, which must
// not change or go away while the sets are used: owner is what keeps it
// mapped, and every set holds it. Labels and targets are copied. Every
// size and offset is checked against src, and every label against the
// label bound, before anything is used.
func ReadImage(src []byte, id Identity, owner any) (train, eval *Set, err error) {
	le := binary.LittleEndian
	if len(src) < imageHeader+2*imageSplit || string(src[:8]) != imageMagic || le.Uint32(src[8:]) != imageVersion {
		return nil, nil, errImage
	}
	if uintptr(unsafe.Pointer(&src[0]))%8 != 0 {
		return nil, nil, fmt.Errorf("data image at %p: not 8-byte aligned", &src[0])
	}
	if Identity(src[16:48]) != id {
		return nil, nil, errors.New("data image: made for other data")
	}
	if total := le.Uint64(src[48:]); total != uint64(len(src)) {
		return nil, nil, fmt.Errorf("data image: header says %d bytes, the image holds %d", total, len(src))
	}
	splits := le.Uint32(src[12:])
	if splits != 1 && splits != 2 {
		return nil, nil, fmt.Errorf("data image: %d splits", splits)
	}
	var sets [2]*Set
	for i, name := range []string{"training split", "test split"}[:splits] {
		d, err := readSplit(src, src[imageHeader+i*imageSplit:imageHeader+(i+1)*imageSplit], name, owner)
		if err != nil {
			return nil, nil, fmt.Errorf("data image: %s: %w", name, err)
		}
		sets[i] = d
	}
	if err := checkCompatible(sets[0], sets[1]); err != nil {
		return nil, nil, fmt.Errorf("data image: %w", err)
	}
	return sets[0], sets[1], nil
}

// readSplit reads one split's header h and the data it points at in src.
func readSplit(src, h []byte, name string, owner any) (*Set, error) {
	le := binary.LittleEndian
	n, features, ndim := le.Uint64(h[0:]), le.Uint64(h[8:]), le.Uint32(h[16:])
	kind, ykind, width := le.Uint32(h[20:]), le.Uint32(h[24:]), le.Uint64(h[32:])
	fOff, yOff := le.Uint64(h[104:]), le.Uint64(h[112:])
	if n == 0 || n > MaxArrayBytes || features == 0 || ndim < 1 || ndim > MaxDims {
		return nil, fmt.Errorf("%d samples of %d features in %d dimensions", n, features, ndim)
	}
	d := &Set{name: name, n: int(n), features: int(features), keep: owner}
	prod := uint64(1)
	for j := range ndim {
		v := le.Uint64(h[40+8*j:])
		hi, lo := bits.Mul64(prod, v)
		if v == 0 || hi != 0 || lo > MaxArrayBytes {
			return nil, fmt.Errorf("shape dimension %d is %d", j, v)
		}
		prod = lo
		d.shape = append(d.shape, int64(v))
	}
	if prod != features {
		return nil, fmt.Errorf("shape %v holds %d features, the header says %d", d.shape, prod, features)
	}
	var esize uint64
	switch kind {
	case featU8:
		esize = 1
	case featF32:
		esize = 4
	default:
		return nil, fmt.Errorf("feature kind %d", kind)
	}
	fb, err := sectionBytes(src, fOff, []uint64{n, features, esize})
	if err != nil {
		return nil, fmt.Errorf("features: %w", err)
	}
	feat := src[fOff : fOff+fb]
	if kind == featU8 {
		d.u8 = feat
	} else {
		d.f32 = unsafe.Slice((*float32)(unsafe.Pointer(&feat[0])), fb/4)
	}
	switch ykind {
	case yLabels:
		if width != 0 {
			return nil, fmt.Errorf("labels with a width of %d", width)
		}
		yb, err := sectionBytes(src, yOff, []uint64{n, 8})
		if err != nil {
			return nil, fmt.Errorf("labels: %w", err)
		}
		d.labels = make([]int64, n)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.labels))), yb), src[yOff:])
		for i, v := range d.labels {
			if v < 0 || v >= maxLabel {
				return nil, fmt.Errorf("label %d of sample %d is not a class index 0..%d", v, i, maxLabel-1)
			}
			d.maxLabel = max(d.maxLabel, v)
		}
	case yTargets:
		if width == 0 || width > MaxArrayBytes {
			return nil, fmt.Errorf("targets with a width of %d", width)
		}
		yb, err := sectionBytes(src, yOff, []uint64{n, width, 4})
		if err != nil {
			return nil, fmt.Errorf("targets: %w", err)
		}
		d.width = int(width)
		d.targets = make([]float32, yb/4)
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d.targets))), yb), src[yOff:])
	default:
		return nil, fmt.Errorf("label kind %d", ykind)
	}
	return d, nil
}

// sectionBytes is the product of dims, checked to lie in src after the
// headers, from the 8-byte aligned offset off.
func sectionBytes(src []byte, off uint64, dims []uint64) (uint64, error) {
	size := uint64(1)
	for _, v := range dims {
		hi, lo := bits.Mul64(size, v)
		if hi != 0 || lo > MaxArrayBytes {
			return 0, fmt.Errorf("%v elements exceed the limit of %d bytes", dims, uint64(MaxArrayBytes))
		}
		size = lo
	}
	if off%8 != 0 || off < imageHeader+2*imageSplit || off > uint64(len(src)) || size > uint64(len(src))-off {
		return 0, fmt.Errorf("%d bytes at offset %d of an image of %d", size, off, len(src))
	}
	return size, nil
}

// keepMapped holds d's owner until here: the features d gathered from
// may be memory that owner's release unmaps.
func (d *Set) keepMapped() { runtime.KeepAlive(d.keep) }
