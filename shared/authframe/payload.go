package authframe

import (
	"fmt"
	"io"
	"slices"
)

// ReadChunk bounds how much payload buffer ReadPayload allocates ahead of
// the bytes that actually arrive, and is the unit in which the protocols
// stream large payloads.
const ReadChunk = 1 << 20

// ReadPayload reads a payload of n declared bytes from src. A length over
// limit is refused with ErrTooLarge before anything is allocated; otherwise
// the buffer grows as bytes arrive, so a peer that declares much and sends
// little costs little. A stream that ends or fails first is ErrTruncated,
// wrapping the read's own error (a deadline, say).
func ReadPayload(src io.Reader, n, limit uint64) ([]byte, error) {
	if n > limit {
		return nil, fmt.Errorf("%w: %d payload bytes declared, limit %d", ErrTooLarge, n, limit)
	}
	buf := make([]byte, 0, min(n, ReadChunk))
	for uint64(len(buf)) < n {
		step := int(min(n-uint64(len(buf)), ReadChunk))
		buf = slices.Grow(buf, step)
		got, err := io.ReadFull(src, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+got]
		if err != nil {
			return nil, fmt.Errorf("%w: got %d of %d payload bytes: %w", ErrTruncated, len(buf), n, err)
		}
	}
	return buf, nil
}
