// Package dataset is the libtorch trainer's data in memory: the bounded
// decoders of MNIST-style IDX files and NumPy .npy files (gzipped or not;
// array.go, idx.go, npy.go, each fuzzed), the splits they make (Set), and
// the batch gather that feeds the model. Nothing read from a file panics:
// every size is checked against the file and MaxArrayBytes. The trainer
// that uses it is ../trainer; the settings keys that name the files are
// documented in the plugin's README.
package dataset

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"unsafe"
)

// maxLabel bounds a class label.
const maxLabel = 1 << 24

// Set is one split in memory: features row-major (uint8 scaled to [0,1]
// when gathered, or float32) and either class labels or float targets.
type Set struct {
	name     string // for messages
	n        int
	shape    []int64 // per sample
	features int
	u8       []uint8
	f32      []float32
	labels   []int64   // cross_entropy
	targets  []float32 // mse
	width    int       // targets per sample
	maxLabel int64
	// keep, for a set read from an image, owns the memory u8 or f32
	// alias (see ReadImage).
	keep any
}

// u8Scale maps a byte to the float32 value torch's x.float().div(255) gives.
var u8Scale = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(i) / 255
	}
	return t
}()

// newDataset pairs a features array with a labels array. Classification
// (cross_entropy) needs integer labels, one per sample; regression (mse)
// takes any numeric targets, width = product of their trailing dimensions.
func newDataset(name string, x, y *array, xName, yName string, loss string) (*Set, error) {
	if len(x.shape) < 1 || x.shape[0] == 0 {
		return nil, fmt.Errorf("%s features %s: %w", name, xName, errNoSamples)
	}
	if len(y.shape) < 1 || y.shape[0] != x.shape[0] {
		return nil, fmt.Errorf("%s: %s holds %d samples, but %s has shape %v", name, xName, x.shape[0], yName, y.shape)
	}
	d := &Set{name: name, n: x.shape[0], features: 1}
	for _, v := range x.shape[1:] {
		d.shape = append(d.shape, int64(v))
		d.features *= v
	}
	if len(d.shape) == 0 {
		d.shape = []int64{1}
	}
	if d.features == 0 {
		return nil, fmt.Errorf("%s features %s: shape %v has no values per sample", name, xName, x.shape)
	}
	switch {
	case x.kind == kindU8:
		d.u8 = x.raw
	case x.kind == kindF32 && !x.bigEndian && uintptr(unsafe.Pointer(unsafe.SliceData(x.raw)))%4 == 0:
		d.f32 = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(x.raw))), len(x.raw)/4)
	default:
		d.f32 = make([]float32, x.elements())
		for i := range d.f32 {
			d.f32[i] = float32(x.float(i))
		}
	}
	for i := range d.f32 {
		if !finite(float64(d.f32[i])) {
			return nil, fmt.Errorf("%s features %s: value %d is %v", name, xName, i, d.f32[i])
		}
	}

	per := y.elements() / y.shape[0]
	if loss == "cross_entropy" {
		if y.kind.isFloat() {
			return nil, fmt.Errorf("%s labels %s are %s: cross_entropy needs integer class labels (use loss = \"mse\" for float targets)", name, yName, y.kind)
		}
		if per != 1 {
			return nil, fmt.Errorf("%s labels %s have shape %v: cross_entropy needs one class label per sample", name, yName, y.shape)
		}
		d.labels = make([]int64, d.n)
		for i := range d.labels {
			v, ok := y.integer(i)
			if !ok || v < 0 || v >= maxLabel {
				return nil, fmt.Errorf("%s labels %s: label %d of sample %d is not a class index 0..%d", name, yName, v, i, maxLabel-1)
			}
			d.labels[i] = v
			d.maxLabel = max(d.maxLabel, v)
		}
		return d, nil
	}
	if per == 0 {
		return nil, fmt.Errorf("%s targets %s have shape %v: no values per sample", name, yName, y.shape)
	}
	d.width = per
	d.targets = make([]float32, y.elements())
	for i := range d.targets {
		v := y.float(i)
		if !finite(v) || math.Abs(v) > math.MaxFloat32 {
			return nil, fmt.Errorf("%s targets %s: value %d is %v", name, yName, i, v)
		}
		d.targets[i] = float32(v)
	}
	return d, nil
}

// Gather writes the samples' features into x (len(idx) rows) and their
// labels or targets into y or t.
func (d *Set) Gather(idx []uint64, x []float32, y []int64, t []float32) {
	f := d.features
	for r, s := range idx {
		i := int(s)
		row := x[r*f : (r+1)*f]
		if d.u8 != nil {
			scaleRow(row, d.u8[i*f:(i+1)*f])
		} else {
			copy(row, d.f32[i*f:(i+1)*f])
		}
		if d.labels != nil {
			y[r] = d.labels[i]
		} else {
			copy(t[r*d.width:(r+1)*d.width], d.targets[i*d.width:(i+1)*d.width])
		}
	}
	d.keepMapped()
}

// Arrays are the set's features (bytes, read as u8Scale's floats, or
// float32: one is nil), its labels or targets (one is nil), for a gather
// outside Go (the shim's). Keep the Set reachable while they are read: a
// set read from an image maps memory that its release unmaps (call
// KeepMapped after).
func (d *Set) Arrays() (u8 []uint8, f32 []float32, labels []int64, targets []float32) {
	return d.u8, d.f32, d.labels, d.targets
}

// KeepMapped holds the memory Arrays returned until here.
func (d *Set) KeepMapped() { d.keepMapped() }

// widenWithin turns byte features into u8Scale's floats when they take at
// most limit bytes so: the batch gather, on the training thread's path,
// then copies rows (30 µs for 64 Fashion-MNIST images, against 52 µs
// scaling bytes), for four times the memory.
func (d *Set) widenWithin(limit int64) {
	if d.u8 == nil || int64(len(d.u8))*4 > limit {
		return
	}
	f := make([]float32, len(d.u8))
	for i, v := range d.u8 {
		f[i] = u8Scale[v]
	}
	d.f32, d.u8 = f, nil
}

// Widen widens the byte features of a training split loaded with WidenMB
// 0 as Load with widenMB would have.
func (d *Set) Widen(widenMB int64) { d.widenWithin(widenMB << 20) }

// scaleRow writes src's bytes into row as u8Scale's floats. Eight at a time
// with the bounds checked once per eight: the batch gather runs on the
// training thread, and this halves its time.
func scaleRow(row []float32, src []uint8) {
	row = row[:len(src)]
	j := 0
	for ; j+8 <= len(src); j += 8 {
		s := src[j : j+8 : j+8]
		r := row[j : j+8 : j+8]
		r[0], r[1], r[2], r[3] = u8Scale[s[0]], u8Scale[s[1]], u8Scale[s[2]], u8Scale[s[3]]
		r[4], r[5], r[6], r[7] = u8Scale[s[4]], u8Scale[s[5]], u8Scale[s[6]], u8Scale[s[7]]
	}
	for ; j < len(src); j++ {
		row[j] = u8Scale[src[j]]
	}
}

// idxNames are the files of an IDX data directory (each may be gzipped).
var idxNames = [4]string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}

// findIDX returns dir/base or dir/base.gz, whichever exists ("" if none).
func findIDX(dir, base string) string {
	for _, p := range []string{filepath.Join(dir, base), filepath.Join(dir, base+".gz")} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// Source names the files of a training split and, optionally, a test
// split: a directory of IDX files (Dir) or .npy pairs (TrainX/TrainY,
// EvalX/EvalY). Loss says how the labels are read ("cross_entropy": class
// indices, "mse": float targets); byte features of the training split are
// widened to float32 at load when that takes at most WidenMB MiB.
type Source struct {
	Dir            string
	TrainX, TrainY string
	EvalX, EvalY   string
	Loss           string
	WidenMB        int64
}

// Load loads the training split and, when there is one, the test split,
// and checks that the two hold samples of the same size. Messages name the
// settings keys (data, ...), the files and what is wrong with them.
func Load(src Source) (train, eval *Set, err error) {
	train, eval, err = load(src)
	if err == nil {
		err = checkCompatible(train, eval)
	}
	if err != nil {
		return nil, nil, err
	}
	return train, eval, nil
}

func load(s Source) (train, eval *Set, err error) {
	if s.TrainX != "" {
		train, err = loadPair("training split", s.TrainX, s.TrainY, decodeNPY, s.Loss)
		if err != nil {
			return nil, nil, err
		}
		train.widenWithin(s.WidenMB << 20)
		if s.EvalX == "" {
			return train, nil, nil
		}
		eval, err = loadPair("test split", s.EvalX, s.EvalY, decodeNPY, s.Loss)
		return train, eval, err
	}
	st, err := os.Stat(s.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("data = %q: %w", s.Dir, err)
	}
	if !st.IsDir() {
		return nil, nil, fmt.Errorf("data = %q is not a directory of IDX files", s.Dir)
	}
	var paths [4]string
	for i, base := range idxNames {
		paths[i] = findIDX(s.Dir, base)
	}
	if paths[0] == "" || paths[1] == "" {
		return nil, nil, fmt.Errorf("data = %q: want %s and %s there (each may end in .gz)", s.Dir, idxNames[0], idxNames[1])
	}
	train, err = loadPair("training split", paths[0], paths[1], decodeIDX, s.Loss)
	if err != nil {
		return nil, nil, err
	}
	train.widenWithin(s.WidenMB << 20)
	switch {
	case paths[2] == "" && paths[3] == "":
		return train, nil, nil
	case paths[2] == "" || paths[3] == "":
		return nil, nil, fmt.Errorf("data = %q: the test split needs both %s and %s", s.Dir, idxNames[2], idxNames[3])
	}
	eval, err = loadPair("test split", paths[2], paths[3], decodeIDX, s.Loss)
	return train, eval, err
}

// IDXTrainImages returns the payload of dir's training images file as it
// is stored (bytes for Fashion-MNIST), for a reference that reads them raw.
func IDXTrainImages(dir string) ([]byte, error) {
	p := findIDX(dir, idxNames[0])
	if p == "" {
		return nil, fmt.Errorf("data = %q: no %s there", dir, idxNames[0])
	}
	a, err := decodeFile(p, decodeIDX)
	if err != nil {
		return nil, err
	}
	return a.raw, nil
}

func loadPair(name, xPath, yPath string, dec func(io.Reader, int64) (*array, error), loss string) (*Set, error) {
	x, err := decodeFile(xPath, dec)
	if err != nil {
		return nil, err
	}
	y, err := decodeFile(yPath, dec)
	if err != nil {
		return nil, err
	}
	return newDataset(name, x, y, xPath, yPath, loss)
}

// checkCompatible refuses a test split whose samples differ from training.
func checkCompatible(train, eval *Set) error {
	if eval == nil {
		return nil
	}
	if eval.features != train.features {
		return fmt.Errorf("the test split has %d features per sample (%v), the training split %d (%v)", eval.features, eval.shape, train.features, train.shape)
	}
	if eval.width != train.width {
		return fmt.Errorf("the test split has %d targets per sample, the training split %d", eval.width, train.width)
	}
	return nil
}

// N is the number of samples.
func (d *Set) N() int { return d.n }

// Features is the number of feature values per sample.
func (d *Set) Features() int { return d.features }

// Shape is a sample's shape (the file's shape without its first dimension).
func (d *Set) Shape() []int64 { return d.shape }

// Labels are the class labels; nil for a set of float targets.
func (d *Set) Labels() []int64 { return d.labels }

// MaxLabel is the largest class label (0 for targets).
func (d *Set) MaxLabel() int64 { return d.maxLabel }

// Width is the number of targets per sample (0 for labels).
func (d *Set) Width() int { return d.width }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
