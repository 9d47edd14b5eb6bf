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
)

// CheckpointFile is the name of the mock trainer's checkpoint in a
// checkpoint directory. It does not depend on the rank, so any rank can
// restore what another saved.
const CheckpointFile = "mock-trainer.ckpt"

// The checkpoint file: magic, the layout digest, features, steps and trained
// (u64 each), the weights, the bias and the feature means (f32 each), and a
// CRC-32C of everything before it. All little-endian.
const (
	checkpointMagic  = "COHMCKP1"
	checkpointHeader = 8 + 32 + 3*8
)

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
	buf := make([]byte, 0, checkpointHeader+4*(2*f+1)+4)
	buf = append(buf, checkpointMagic...)
	d := t.layout.Digest()
	buf = append(buf, d[:]...)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(f))
	buf = binary.LittleEndian.AppendUint64(buf, t.steps)
	buf = binary.LittleEndian.AppendUint64(buf, t.trained)
	for _, v := range t.weight {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
	}
	buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(t.bias))
	for _, v := range t.mean {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
	}
	return binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
}

// LoadCheckpoint restores dir/CheckpointFile bitwise and returns the step
// count it held. The file must match the configured layout and checksum.
// The restored step count counts as published.
func (t *Trainer) LoadCheckpoint(_ context.Context, dir string) (uint64, error) {
	path := filepath.Join(dir, CheckpointFile)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.data == nil {
		return 0, errors.New("mock trainer: LoadCheckpoint before Configure")
	}
	f := len(t.weight)
	want := int64(checkpointHeader + 4*(2*f+1) + 4)
	buf, err := readFileExact(path, want)
	if err != nil {
		return 0, fmt.Errorf("mock trainer: load checkpoint: %w", err)
	}
	bad := func(what string) (uint64, error) {
		return 0, fmt.Errorf("mock trainer: load checkpoint %s: %s", path, what)
	}
	if string(buf[:8]) != checkpointMagic {
		return bad("not a mock trainer checkpoint (bad magic)")
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
	t.lastPub = t.steps
	vals := body[checkpointHeader:]
	next := func() float32 {
		v := math.Float32frombits(binary.LittleEndian.Uint32(vals))
		vals = vals[4:]
		return v
	}
	for j := range t.weight {
		t.weight[j] = next()
	}
	t.bias = next()
	for j := range t.mean {
		t.mean[j] = next()
	}
	return t.steps, nil
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
