package dataset

import (
	"encoding/binary"
	"fmt"
	"io"
)

// IDX is the MNIST file format: two zero bytes, a type code, the number of
// dimensions, one big-endian uint32 per dimension, then the values in
// row-major order, big-endian.
var idxKinds = map[byte]elemKind{
	0x08: kindU8,
	0x09: kindI8,
	0x0B: kindI16,
	0x0C: kindI32,
	0x0D: kindF32,
	0x0E: kindF64,
}

// decodeIDX decodes an IDX stream; known is the stream's length when known,
// or -1. Every size is checked before anything is allocated.
func decodeIDX(r io.Reader, known int64) (*array, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, fmt.Errorf("not an IDX file: %d-byte header unreadable: %v", len(head), err)
	}
	kind, ok := idxKinds[head[2]]
	if head[0] != 0 || head[1] != 0 || !ok {
		return nil, fmt.Errorf("not an IDX file: magic %#08x (want 0x0000TTNN: two zero bytes, a type code 08 09 0B 0C 0D 0E, a dimension count)",
			binary.BigEndian.Uint32(head[:]))
	}
	ndim := int(head[3])
	if ndim < 1 || ndim > MaxDims {
		return nil, fmt.Errorf("IDX file with %d dimensions; want 1..%d", ndim, MaxDims)
	}
	dimBytes := make([]byte, 4*ndim)
	if _, err := io.ReadFull(r, dimBytes); err != nil {
		return nil, fmt.Errorf("IDX header truncated in its %d dimensions: %v", ndim, err)
	}
	shape := make([]uint64, ndim)
	for i := range shape {
		shape[i] = uint64(binary.BigEndian.Uint32(dimBytes[4*i:]))
	}
	n, err := payloadSize(shape, kind.size())
	if err != nil {
		return nil, fmt.Errorf("IDX file: %w", err)
	}
	if known >= 0 {
		known -= int64(4 + 4*ndim)
	}
	raw, err := readPayload(r, n, known)
	if err != nil {
		return nil, fmt.Errorf("IDX %s %v: %w", kind, shape, err)
	}
	a := &array{kind: kind, bigEndian: true, raw: raw, shape: make([]int, ndim)}
	for i, d := range shape {
		a.shape[i] = int(d)
	}
	return a, nil
}
