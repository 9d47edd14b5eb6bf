//go:build gpu

// The real backend on a host with a GPU, NCCL and the CUDA runtime:
// `go test -tags gpu` (or the test binary gpu-check.sh runs, built with
// `go test -c -tags gpu`). COHORT_NCCL_LIBRARY, COHORT_CUDART_LIBRARY and
// COHORT_CUBLAS_LIBRARY point at the libraries when they are nowhere
// usual.

package backend

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/cudalib"
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

// A one-rank communicator over device memory: a weighted contribution
// goes through all-reduce and broadcast unchanged, and divided by its
// weight reads back as the values.
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
	data, err := b.Alloc(0, 4*len(x))
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if err := data.Write(f32bytes(scaled)); err != nil {
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
	for i := range x {
		got := float64(math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))) / w
		if math.Abs(got-float64(x[i])) > 1e-6 {
			t.Errorf("element %d: mean %v, want %v", i, got, x[i])
		}
	}
	if err := c.Abort(); err != nil {
		t.Errorf("Abort: %v", err)
	}
}

// The device fold (cuBLAS scale and axpy, then copies on the device) of
// four ranks' values with their shares, against the float64 reference.
func TestGPUFold(t *testing.T) {
	b := openGPU(t)
	const n, ranks = 1<<20 + 3, 4
	shares := []float32{0.1, 0.4, 0, 0.5}
	var mems []Memory
	vals := make([][]float32, ranks)
	for r := range ranks {
		vals[r] = make([]float32, n)
		for i := range vals[r] {
			vals[r][i] = float32(math.Sin(float64(r*n+i))) * float32(r+1)
		}
		m, err := b.Alloc(0, 4*n)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Write(f32bytes(vals[r])); err != nil {
			t.Fatal(err)
		}
		mems = append(mems, m)
	}
	if err := b.Scale(mems[0], 0, n, shares[0]); err != nil {
		t.Fatal(err)
	}
	for r := 1; r < ranks; r++ {
		if err := b.Axpy(mems[0], mems[r], 0, n, shares[r]); err != nil {
			t.Fatal(err)
		}
	}
	for r := 1; r < ranks; r++ {
		if err := b.CopyRange(mems[r], 0, mems[0], 0, n); err != nil {
			t.Fatal(err)
		}
	}
	worst := 0.0
	for r := range ranks {
		out := make([]byte, 4*n)
		if err := mems[r].Read(out); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			var want, mag float64
			for q := range ranks {
				want += float64(shares[q]) * float64(vals[q][i])
				mag += math.Abs(float64(shares[q]) * float64(vals[q][i]))
			}
			got := float64(math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])))
			if d := math.Abs(got-want) / (mag + 1e-30); d > worst {
				worst = d
			}
		}
	}
	t.Logf("nccl_gpu fold: %d ranks × %d floats, worst relative error %.2e against float64", ranks, n, worst)
	if worst > 1e-6 {
		t.Errorf("the device fold is off by %.2e relative to float64", worst)
	}
	if _, err := b.DeviceID(0); err != nil {
		t.Errorf("DeviceID: %v", err)
	}
}

// ipcChild is set in the process TestGPUIPC starts: it owns the memory.
const ipcChild = "COHORT_GPU_IPC_CHILD"

// Memory of another process maps by handle (CUDA IPC): the child writes
// values, the parent reads them through the mapping and doubles them with
// cuBLAS, and the child sees the doubled values in its own memory.
func TestGPUIPC(t *testing.T) {
	if os.Getenv(ipcChild) != "" {
		ipcOwner(t)
		return
	}
	b := openGPU(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUIPC$")
	cmd.Env = append(os.Environ(), ipcChild+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(outp)
	var h IPCHandle
	for lines.Scan() {
		if hexed, ok := strings.CutPrefix(lines.Text(), "handle "); ok {
			raw, err := hex.DecodeString(hexed)
			if err != nil || len(raw) != len(h) {
				t.Fatalf("child's handle %q: %v", hexed, err)
			}
			copy(h[:], raw)
			break
		}
	}
	m, err := b.Open(0, h, 4*ipcN)
	if err != nil {
		t.Fatalf("Open the child's memory: %v", err)
	}
	got := make([]byte, 4*ipcN)
	if err := m.Read(got); err != nil {
		t.Fatal(err)
	}
	for i := range ipcN {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])); v != float32(i) {
			t.Fatalf("element %d through the mapping: %v, want %v", i, v, float32(i))
		}
	}
	if err := b.Scale(m, 0, ipcN, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close the mapping: %v", err)
	}
	fmt.Fprintln(in, "doubled")
	var verdict string
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), "verdict "); ok {
			verdict = v
		}
	}
	if err := cmd.Wait(); err != nil || verdict != "ok" {
		t.Fatalf("the child: %v, verdict %q", err, verdict)
	}
	t.Logf("nccl_gpu ipc: mapped another process's %d floats, read and doubled them in place", ipcN)
}

const ipcN = 1 << 16

// ipcOwner is the child's side: allocate, fill, print the handle, wait
// for the parent, check its values doubled.
func ipcOwner(t *testing.T) {
	b := openGPU(t)
	m, err := b.Alloc(0, 4*ipcN)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	v := make([]float32, ipcN)
	for i := range v {
		v[i] = float32(i)
	}
	if err := m.Write(f32bytes(v)); err != nil {
		t.Fatal(err)
	}
	h, err := m.Handle()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("handle %s\n", hex.EncodeToString(h[:]))
	bufio.NewReader(os.Stdin).ReadString('\n')
	got := make([]byte, 4*ipcN)
	if err := m.Read(got); err != nil {
		t.Fatal(err)
	}
	verdict := "ok"
	for i := range ipcN {
		if x := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])); x != 2*float32(i) {
			verdict = fmt.Sprintf("element %d is %v, want %v", i, x, 2*float32(i))
			break
		}
	}
	fmt.Printf("verdict %s\n", verdict)
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
