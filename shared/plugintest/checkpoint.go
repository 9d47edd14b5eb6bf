package plugintest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/cohortdl/cohort/shared/atomicfile"
	"github.com/cohortdl/cohort/shared/plugin"
)

// CheckpointFile is the name of the mock trainer's checkpoint in a
// checkpoint directory. It does not depend on the rank, so any rank can
// restore what another saved.
const CheckpointFile = "mock-trainer.ckpt"

// The checkpoint file: magic, the layout digest, features, steps, trained
// and the schedule's step (u64 each), the weights, the bias, the feature
// means and the momentum velocities of weight and bias (f32 each), and a
// CRC-32C of everything before it. All little-endian.
const (
	checkpointMagic  = "COHMCKP2"
	checkpointHeader = 8 + 32 + 4*8
)

// checkpointSize is the file's size for a model of f features.
func checkpointSize(f int) int64 { return int64(checkpointHeader + 4*(3*f+2) + 4) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SaveCheckpoint writes parameters, buffer and counters to
// dir/CheckpointFile atomically (temp file, fsync, rename, fsync of dir) and
// returns its path.
func (t *Trainer) SaveCheckpoint(_ context.Context, dir string) ([]string, error) {
	t.mu.Lock()
	if t.data == nil {
		t.mu.Unlock()
		return nil, errors.New("mock trainer: SaveCheckpoint before Configure")
	}
	buf := t.encodeCheckpointLocked()
	t.mu.Unlock()

	path := filepath.Join(dir, CheckpointFile)
	if err := atomicfile.WriteBytes(path, buf); err != nil {
		return nil, fmt.Errorf("mock trainer: save checkpoint: %w", err)
	}
	return []string{path}, nil
}

func (t *Trainer) encodeCheckpointLocked() []byte {
	f := len(t.weight)
	buf := make([]byte, 0, checkpointSize(f))
	buf = append(buf, checkpointMagic...)
	d := t.layout.Digest()
	buf = append(buf, d[:]...)
	for _, v := range []uint64{uint64(f), t.steps, t.trained, t.sched} {
		buf = binary.LittleEndian.AppendUint64(buf, v)
	}
	for _, vs := range [][]float32{t.weight, t.bias, t.mean, t.vel} {
		for _, v := range vs {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
	}
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
}

// LoadCheckpoint restores dir/CheckpointFile, which must match the
// configured layout and its checksum, and returns the step count it held;
// the restored steps count as published. A resume restores the model
// bitwise (into the arena, when it lives there); a replacement restores
// the optimizer's velocities and the counters only and leaves the model as
// it is, for the Adopt of the arena's newer values that follows.
func (t *Trainer) LoadCheckpoint(_ context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	path := filepath.Join(dir, CheckpointFile)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.data == nil {
		return plugin.LoadResult{}, errors.New("mock trainer: LoadCheckpoint before Configure")
	}
	f := len(t.weight)
	buf, err := readFileExact(path, checkpointSize(f))
	if err != nil {
		return plugin.LoadResult{}, fmt.Errorf("mock trainer: load checkpoint: %w", err)
	}
	bad := func(what string) (plugin.LoadResult, error) {
		return plugin.LoadResult{}, fmt.Errorf("mock trainer: load checkpoint %s: %s", path, what)
	}
	if string(buf[:8]) != checkpointMagic {
		return bad("not a mock trainer checkpoint of this version (bad magic)")
	}
	body, sum := buf[:len(buf)-4], binary.LittleEndian.Uint32(buf[len(buf)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return bad("checksum mismatch")
	}
	if d := t.layout.Digest(); string(buf[8:40]) != string(d[:]) {
		return bad("saved for a different model layout")
	}
	if n := binary.LittleEndian.Uint64(buf[40:]); n != uint64(f) {
		return bad(fmt.Sprintf("holds %d features, the model has %d", n, f))
	}
	t.steps = binary.LittleEndian.Uint64(buf[48:])
	t.trained = binary.LittleEndian.Uint64(buf[56:])
	t.sched = binary.LittleEndian.Uint64(buf[64:])
	t.lastPub = t.steps
	vals := body[checkpointHeader:]
	read := func(dst []float32) {
		for j := range dst {
			dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(vals))
			vals = vals[4:]
		}
	}
	if reason == plugin.LoadReplacement {
		vals = vals[4*(2*f+1):] // the arena holds newer parameters
	} else {
		read(t.weight)
		read(t.bias)
		read(t.mean)
		t.pub = t.pub[:0]
	}
	read(t.vel)
	return plugin.LoadResult{StepCount: t.steps}, nil
}

// readFileExact reads path, which must hold exactly want bytes.
func readFileExact(path string, want int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != want {
		return nil, fmt.Errorf("%s holds %d bytes, want %d", path, st.Size(), want)
	}
	buf := make([]byte, want)
	if _, err := io.ReadFull(f, buf); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf, nil
}
