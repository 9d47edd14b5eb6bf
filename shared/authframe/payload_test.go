package authframe

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReadPayload(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 300_000) // 3 MB, three chunks and some
	for _, tc := range []struct {
		name    string
		src     io.Reader
		n       uint64
		limit   uint64
		want    error
		mention string
	}{
		{name: "empty", src: bytes.NewReader(nil), n: 0, limit: 0},
		{name: "exact", src: bytes.NewReader(data[:10]), n: 10, limit: 10},
		{name: "several chunks", src: bytes.NewReader(data), n: uint64(len(data)), limit: 1 << 30},
		{name: "one byte at a time", src: iotest.OneByteReader(bytes.NewReader(data[:100])), n: 100, limit: 100},
		{name: "over the limit", src: bytes.NewReader(data[:11]), n: 11, limit: 10, want: ErrTooLarge, mention: "11 payload bytes declared, limit 10"},
		{name: "huge declared", src: bytes.NewReader(nil), n: 1<<64 - 1, limit: 1 << 20, want: ErrTooLarge, mention: "18446744073709551615"},
		{name: "ends early", src: bytes.NewReader(data[:5]), n: 10, limit: 10, want: ErrTruncated, mention: "got 5 of 10"},
		{name: "ends in a later chunk", src: bytes.NewReader(data[:ReadChunk+3]), n: 2 * ReadChunk, limit: 1 << 30, want: ErrTruncated, mention: "got 1048579 of 2097152"},
		{name: "read fails", src: iotest.TimeoutReader(bytes.NewReader(data)), n: 2 * ReadChunk, limit: 1 << 30, want: ErrTruncated, mention: "timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadPayload(tc.src, tc.n, tc.limit)
			if tc.want == nil {
				if err != nil || !bytes.Equal(got, data[:tc.n]) {
					t.Fatalf("got %d bytes, %v; want the first %d bytes", len(got), err, tc.n)
				}
				return
			}
			if !errors.Is(err, tc.want) || got != nil {
				t.Fatalf("got %d bytes, %v; want nothing and %v", len(got), err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
		})
	}
}

// A length over the limit allocates nothing near it; one within the limit
// allocates as bytes arrive, not up front.
func TestReadPayloadAllocatesAsBytesArrive(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n, limit uint64
		want     error
		maxAlloc uint64
	}{
		{"huge length refused", 1 << 40, 1 << 24, ErrTooLarge, 64 << 10},
		{"large length, little sent", 1 << 30, 1 << 30, ErrTruncated, ReadChunk + 64<<10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := ReadPayload(bytes.NewReader(make([]byte, 100)), tc.n, tc.limit)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > tc.maxAlloc {
				t.Fatalf("declaring %d bytes allocated %d, want at most %d", tc.n, got, tc.maxAlloc)
			}
		})
	}
}
