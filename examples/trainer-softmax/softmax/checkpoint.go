package softmax

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/cohortdl/cohort/shared/atomicfile"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The files of a checkpoint directory: the parameters (weight, then bias)
// and the momentum velocity, each little-endian float32s, and the
// metadata, written last, naming both with their SHA-256 so a directory
// whose save did not finish is refused. Their names do not depend on the
// rank, so any rank can restore what another saved.
const (
	ParamsFile   = "softmax-params.f32"
	VelocityFile = "softmax-velocity.f32"
	MetaFile     = "softmax.json"

	checkpointFormat = "cohort-softmax-checkpoint/1"
	maxMetaBytes     = 1 << 16
)

type meta struct {
	Format       string            `json:"format"`
	LayoutDigest string            `json:"layout_digest"`
	Steps        uint64            `json:"steps"`
	ScheduleStep uint64            `json:"schedule_step"`
	SHA256       map[string]string `json:"sha256"`
}

// SaveCheckpoint writes the parameters, the velocity and the counters into
// dir, each file through shared/atomicfile (a temporary file, fsynced and
// renamed), the metadata last.
func (t *Trainer) SaveCheckpoint(_ context.Context, dir string) ([]string, error) {
	t.mu.Lock()
	if t.train == nil {
		t.mu.Unlock()
		return nil, errors.New("softmax: SaveCheckpoint before Configure")
	}
	d := t.layout.Digest()
	m := meta{Format: checkpointFormat, LayoutDigest: hex.EncodeToString(d[:]), Steps: t.steps, ScheduleStep: t.sched, SHA256: map[string]string{}}
	files := map[string][]byte{ParamsFile: floatBytes(t.weight, t.bias), VelocityFile: floatBytes(t.vel)}
	t.mu.Unlock()

	var out []string
	for _, name := range []string{ParamsFile, VelocityFile} {
		sum := sha256.Sum256(files[name])
		m.SHA256[name] = hex.EncodeToString(sum[:])
		path := filepath.Join(dir, name)
		if err := atomicfile.WriteBytes(path, files[name]); err != nil {
			return nil, fmt.Errorf("softmax: save checkpoint: %w", err)
		}
		out = append(out, path)
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("softmax: save checkpoint: %w", err)
	}
	path := filepath.Join(dir, MetaFile)
	if err := atomicfile.WriteBytes(path, append(raw, '\n')); err != nil {
		return nil, fmt.Errorf("softmax: save checkpoint: %w", err)
	}
	return append(out, path), nil
}

// LoadCheckpoint restores a checkpoint of this layout. On a resume it
// restores everything, writing the parameters into the arena; on a
// replacement the arena holds newer parameters than the checkpoint's, so
// it restores only the velocity and the counters.
func (t *Trainer) LoadCheckpoint(_ context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.train == nil {
		return plugin.LoadResult{}, errors.New("softmax: LoadCheckpoint before Configure")
	}
	m, err := readMeta(filepath.Join(dir, MetaFile))
	if err != nil {
		return plugin.LoadResult{}, fmt.Errorf("softmax: load checkpoint: %w", err)
	}
	if d := t.layout.Digest(); m.LayoutDigest != hex.EncodeToString(d[:]) {
		return plugin.LoadResult{}, fmt.Errorf("softmax: load checkpoint %s: saved for another model layout", dir)
	}
	n := len(t.vel)
	params, err := readFloats(filepath.Join(dir, ParamsFile), n, m.SHA256[ParamsFile])
	if err != nil {
		return plugin.LoadResult{}, fmt.Errorf("softmax: load checkpoint: %w", err)
	}
	vel, err := readFloats(filepath.Join(dir, VelocityFile), n, m.SHA256[VelocityFile])
	if err != nil {
		return plugin.LoadResult{}, fmt.Errorf("softmax: load checkpoint: %w", err)
	}
	if reason == plugin.LoadResume {
		copy(t.weight, params)
		copy(t.bias, params[len(t.weight):])
		t.published = nil
	}
	copy(t.vel, vel)
	t.steps, t.lastPub, t.sched = m.Steps, m.Steps, m.ScheduleStep
	return plugin.LoadResult{StepCount: m.Steps}, nil
}

func readMeta(path string) (meta, error) {
	var m meta
	f, err := os.Open(path)
	if err != nil {
		return m, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return m, err
	}
	if len(raw) > maxMetaBytes {
		return m, fmt.Errorf("%s is over %d bytes", path, maxMetaBytes)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return m, fmt.Errorf("%s: %w", path, err)
	}
	if m.Format != checkpointFormat {
		return m, fmt.Errorf("%s: format %q, want %q", path, m.Format, checkpointFormat)
	}
	return m, nil
}

// readFloats reads n little-endian float32s from path, whose SHA-256 must
// be sum: a file of another size is refused before it is read.
func readFloats(path string, n int, sum string) ([]float32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != int64(4*n) {
		return nil, fmt.Errorf("%s holds %d bytes, want %d", path, st.Size(), 4*n)
	}
	raw := make([]byte, 4*n)
	if _, err := io.ReadFull(f, raw); err != nil {
		return nil, err
	}
	if got := sha256.Sum256(raw); hex.EncodeToString(got[:]) != sum {
		return nil, fmt.Errorf("%s does not match the SHA-256 %s lists: an unfinished or mixed save", path, MetaFile)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, nil
}

// floatBytes is vs in a row as little-endian float32s.
func floatBytes(vs ...[]float32) []byte {
	all := slices.Concat(vs...)
	b := make([]byte, 4*len(all))
	for i, v := range all {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}
