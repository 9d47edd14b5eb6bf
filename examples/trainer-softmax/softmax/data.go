package softmax

import (
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// split is one side of a data set: n rows of features, stored as bytes
// scaled by 1/255 (idx images) or as float32s (synthetic data), and a
// label per row.
type split struct {
	n, features int
	labels      []uint8
	pixels      []byte
	floats      []float32
}

// row writes row i's features into x (features long).
func (s *split) row(i int, x []float32) {
	if s.pixels != nil {
		for j, p := range s.pixels[i*s.features : (i+1)*s.features] {
			x[j] = float32(p) / 255
		}
		return
	}
	copy(x, s.floats[i*s.features:(i+1)*s.features])
}

// The idx files of MNIST and Fashion-MNIST, gzip-compressed.
const (
	trainImages = "train-images-idx3-ubyte.gz"
	trainLabels = "train-labels-idx1-ubyte.gz"
	evalImages  = "t10k-images-idx3-ubyte.gz"
	evalLabels  = "t10k-labels-idx1-ubyte.gz"
	// maxRows bounds an idx file's row count before anything is allocated.
	maxRows = 1 << 24
	// idxClasses: MNIST's and Fashion-MNIST's labels are 0..9.
	idxClasses = 10
)

// loadIdx reads a training and an evaluation split from dir.
func loadIdx(dir string) (train, eval *split, err error) {
	if train, err = readSplit(filepath.Join(dir, trainImages), filepath.Join(dir, trainLabels)); err != nil {
		return nil, nil, err
	}
	if eval, err = readSplit(filepath.Join(dir, evalImages), filepath.Join(dir, evalLabels)); err != nil {
		return nil, nil, err
	}
	if eval.features != train.features {
		return nil, nil, fmt.Errorf("%s: %d features a row, the training split %d", dir, eval.features, train.features)
	}
	return train, eval, nil
}

func readSplit(images, labels string) (*split, error) {
	pix, dims, err := readIdx(images, 0x0803, 3)
	if err != nil {
		return nil, err
	}
	lab, ldims, err := readIdx(labels, 0x0801, 1)
	if err != nil {
		return nil, err
	}
	if ldims[0] != dims[0] {
		return nil, fmt.Errorf("%s holds %d labels for the %d images of %s", labels, ldims[0], dims[0], images)
	}
	for i, l := range lab {
		if l >= idxClasses {
			return nil, fmt.Errorf("%s: label %d of row %d is not a class 0..%d", labels, l, i, idxClasses-1)
		}
	}
	return &split{n: dims[0], features: dims[1] * dims[2], labels: lab, pixels: pix}, nil
}

// readIdx reads a gzip-compressed idx file of unsigned bytes with the
// given magic and rank, refusing dimensions past maxRows rows of at most
// 4096 bytes before it allocates.
func readIdx(path string, magic uint32, rank int) ([]byte, []int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("softmax data: %w", err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, nil, fmt.Errorf("softmax data %s: %w", path, err)
	}
	head := make([]uint32, 1+rank)
	if err := binary.Read(gz, binary.BigEndian, head); err != nil {
		return nil, nil, fmt.Errorf("softmax data %s: header: %w", path, err)
	}
	if head[0] != magic {
		return nil, nil, fmt.Errorf("softmax data %s: magic %#08x, want %#08x", path, head[0], magic)
	}
	dims, size := make([]int, rank), 1
	for i, d := range head[1:] {
		dims[i] = int(d)
		size *= int(d)
	}
	if dims[0] == 0 || dims[0] > maxRows || size/dims[0] > 4096 {
		return nil, nil, fmt.Errorf("softmax data %s: dimensions %v out of bounds", path, dims)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(gz, data); err != nil {
		return nil, nil, fmt.Errorf("softmax data %s: %w", path, err)
	}
	return data, dims, nil
}

// synthetic makes a training and an evaluation split from seed: classes
// Gaussian clouds of unit spread around centres drawn from the seed, about
// 4 apart, which a linear classifier separates well but not perfectly.
func synthetic(seed uint64, samples, evalSamples, features, classes int) (train, eval *split) {
	rng := rand.New(rand.NewPCG(seed, 0x736f66746d6178)) // "softmax"
	centres := make([]float32, classes*features)
	for i := range centres {
		centres[i] = float32(rng.NormFloat64() * 3 / math.Sqrt(float64(features)))
	}
	draw := func(n int) *split {
		s := &split{n: n, features: features, labels: make([]uint8, n), floats: make([]float32, n*features)}
		for i := range n {
			c := rng.IntN(classes)
			s.labels[i] = uint8(c)
			for j := range features {
				s.floats[i*features+j] = centres[c*features+j] + float32(rng.NormFloat64())
			}
		}
		return s
	}
	return draw(samples), draw(evalSamples)
}
