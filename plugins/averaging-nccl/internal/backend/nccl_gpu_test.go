//go:build gpu

// The real backend on a host with a GPU, NCCL and the CUDA runtime:
// `go test -tags gpu` (or the test binary gpu-check.sh runs, built with
// `go test -c -tags gpu`). COHORT_NCCL_LIBRARY and COHORT_CUDART_LIBRARY
// point at the libraries when they are nowhere usual.

package backend

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/cudalib"
)

func openGPU(t *testing.T) *NCCL {
	t.Helper()
	b, err := OpenNCCL(cudalib.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if n, err := b.DeviceCount(); err != nil || n == 0 {
		t.Fatalf("device count %d: %v", n, err)
	}
	return b
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// A one-rank communicator over a device buffer: a weighted contribution
// and its weight go through all-reduce and broadcast unchanged, and the
// mean read back is the values.
func TestGPUOneRank(t *testing.T) {
	b := openGPU(t)
	id, err := b.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := b.InitComm(ctx, id, 1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	x := []float32{1.5, -2, 3.25, 1e-3, 0}
	const w = 3.0
	scaled := make([]float32, len(x))
	for i := range x {
		scaled[i] = x[i] * w
	}
	data, err := c.Alloc(4 * len(x))
	if err != nil {
		t.Fatal(err)
	}
	weights, err := c.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	wb := make([]byte, 8)
	binary.LittleEndian.PutUint64(wb, math.Float64bits(w))
	if err := weights.Write(wb); err != nil {
		t.Fatal(err)
	}
	if err := data.Write(f32bytes(scaled)); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduceSum(ctx, weights, Float64); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduceSum(ctx, data, Float32); err != nil {
		t.Fatal(err)
	}
	if err := c.Broadcast(ctx, data, Float32, 0); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*len(x))
	if err := data.Read(out); err != nil {
		t.Fatal(err)
	}
	if err := weights.Read(wb); err != nil {
		t.Fatal(err)
	}
	total := math.Float64frombits(binary.LittleEndian.Uint64(wb))
	for i := range x {
		got := float64(math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))) / total
		if math.Abs(got-float64(x[i])) > 1e-6 {
			t.Errorf("element %d: mean %v, want %v (total weight %v)", i, got, x[i], total)
		}
	}
	if err := c.Abort(); err != nil {
		t.Errorf("Abort: %v", err)
	}
}

// A two-rank communicator whose second rank never comes is given up on
// within its deadline, aborted.
func TestGPUInitPeerNeverComes(t *testing.T) {
	b := openGPU(t)
	id, err := b.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	c, err := b.InitComm(ctx, id, 2, 0, 0)
	took := time.Since(start)
	if err == nil {
		c.Abort()
		t.Fatal("a two-rank communicator was built with one rank")
	}
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("InitComm: %v; want ErrAborted after the deadline", err)
	}
	if took > 6*time.Second {
		t.Errorf("InitComm took %v with a 3s deadline", took)
	}
	t.Logf("gave up after %v", took.Round(time.Millisecond))
}
