package trainer

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cohortdl/cohort/shared/atomicfile"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The files of a checkpoint directory. Their names do not depend on the
// rank, so any rank can restore what another saved.
const (
	// CheckpointModel holds the model's parameters and buffers: a
	// TorchScript archive written by torch::save of the module (built-in
	// models; torch::load(module, path) in C++, torch.jit.load in Python)
	// or the TorchScript module itself (model = "file.pt").
	CheckpointModel = "libtorch-model.pt"
	// CheckpointOptimizer is torch::save(optimizer): its state (momentum,
	// Adam moments and steps) and options.
	CheckpointOptimizer = "libtorch-optimizer.pt"
	// CheckpointMeta is written last and names the other two with their
	// SHA-256, so a directory whose save did not finish is refused.
	CheckpointMeta = "libtorch-trainer.json"
	// ExportedModel is the model as a TorchScript module with a forward,
	// for use outside cohort: torch.jit.load(path) in Python, on inputs
	// shaped and scaled as the trainer's (pixels / 255 for image data).
	// Every checkpoint holds one, so the run's final model (OUT/model) and
	// any checkpoint load without cohort.
	ExportedModel = "model.pt"

	checkpointFormat = "cohort-libtorch-checkpoint/1"
	maxMetaBytes     = 1 << 20
)

type checkpointFile struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

type checkpointMeta struct {
	Format       string                    `json:"format"`
	Model        string                    `json:"model"`
	LayoutDigest string                    `json:"layout_digest"`
	Steps        uint64                    `json:"steps"`
	ScheduleStep uint64                    `json:"schedule_step"`
	Libtorch     string                    `json:"libtorch"`
	Files        map[string]checkpointFile `json:"files"`
}

// SaveCheckpoint writes the model, the optimizer and the counters under dir
// (created if missing). Each file is written to a temporary name, synced
// and renamed; the metadata file goes last.
func (t *Trainer) SaveCheckpoint(_ context.Context, dir string) ([]string, error) {
	return onCalls(t, func() ([]string, error) { return t.saveCheckpoint(dir) })
}

func (t *Trainer) saveCheckpoint(dir string) ([]string, error) {
	t.lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return nil, errors.New("libtorch trainer: SaveCheckpoint before Configure")
	}
	files, err := t.saveLocked(dir)
	if err != nil {
		return nil, fmt.Errorf("libtorch trainer: save checkpoint in %s: %w", dir, err)
	}
	return files, nil
}

func (t *Trainer) saveLocked(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	suffix := ".tmp-" + randomHex()
	names := []string{CheckpointModel, CheckpointOptimizer, ExportedModel}
	tmp := make([]string, len(names))
	for i, n := range names {
		tmp[i] = filepath.Join(dir, "."+n+suffix)
	}
	defer func() {
		for _, p := range tmp {
			os.Remove(p) // gone after a successful rename
		}
	}()
	if err := t.model.Save(tmp[0], tmp[1]); err != nil {
		return nil, err
	}
	if err := t.model.Export(tmp[2]); err != nil {
		return nil, err
	}
	digest := t.layout.Digest()
	meta := checkpointMeta{
		Format:       checkpointFormat,
		Model:        t.s.Model,
		LayoutDigest: hex.EncodeToString(digest[:]),
		Steps:        t.steps,
		ScheduleStep: t.schedStep,
		Libtorch:     t.shim.TorchVersion,
		Files:        map[string]checkpointFile{},
	}
	for i, p := range tmp {
		f, err := syncAndHash(p)
		if err != nil {
			return nil, err
		}
		meta.Files[names[i]] = f
	}
	out := make([]string, 0, len(names)+1)
	for i, p := range tmp {
		final := filepath.Join(dir, names[i])
		if err := os.Rename(p, final); err != nil {
			return nil, err
		}
		out = append(out, final)
	}
	buf, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return nil, err
	}
	metaPath := filepath.Join(dir, CheckpointMeta)
	if err := atomicfile.WriteBytes(metaPath, append(buf, '\n')); err != nil {
		return nil, err
	}
	return append(out, metaPath), nil
}

// LoadCheckpoint restores a checkpoint saved for the same model layout,
// bitwise: parameters, buffers, optimizer state, step counters. The
// restored steps count as published. A replacement (plugin.LoadReplacement)
// keeps the arena's newer parameters and buffers: the shim restores the
// checkpoint's into a model that trains in the arena too, so the arena's
// bytes go back after it; a model that copies takes them at the Adopt
// that follows.
func (t *Trainer) LoadCheckpoint(_ context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	return onCalls(t, func() (plugin.LoadResult, error) { return t.loadCheckpoint(dir, reason) })
}

func (t *Trainer) loadCheckpoint(dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	t.lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return plugin.LoadResult{}, errors.New("libtorch trainer: LoadCheckpoint before Configure")
	}
	meta, err := t.readMetaLocked(dir)
	if err != nil {
		return plugin.LoadResult{}, fmt.Errorf("libtorch trainer: load checkpoint %s: %w", dir, err)
	}
	var newer []byte
	if reason == plugin.LoadReplacement && t.zeroCopy && t.mapping != nil {
		newer = bytes.Clone(t.mapping.Bytes())
	}
	if err := t.model.Load(filepath.Join(dir, CheckpointModel), filepath.Join(dir, CheckpointOptimizer)); err != nil {
		return plugin.LoadResult{}, fmt.Errorf("libtorch trainer: load checkpoint %s: %w", dir, err)
	}
	if newer != nil {
		copy(t.mapping.Bytes(), newer)
	}
	t.steps, t.lastPub, t.schedStep = meta.Steps, meta.Steps, meta.ScheduleStep
	return plugin.LoadResult{StepCount: meta.Steps}, nil
}

func (t *Trainer) readMetaLocked(dir string) (checkpointMeta, error) {
	var meta checkpointMeta
	path := filepath.Join(dir, CheckpointMeta)
	f, err := os.Open(path)
	if err != nil {
		return meta, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return meta, err
	}
	if len(raw) > maxMetaBytes {
		return meta, fmt.Errorf("%s exceeds %d bytes", path, maxMetaBytes)
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return meta, fmt.Errorf("%s: %w", path, err)
	}
	if meta.Format != checkpointFormat {
		return meta, fmt.Errorf("%s: format %q, want %q", path, meta.Format, checkpointFormat)
	}
	digest := t.layout.Digest()
	if meta.LayoutDigest != hex.EncodeToString(digest[:]) {
		return meta, fmt.Errorf("saved for a different model layout (model %q); this trainer runs %q", meta.Model, t.s.Model)
	}
	for _, name := range []string{CheckpointModel, CheckpointOptimizer} {
		want, ok := meta.Files[name]
		if !ok {
			return meta, fmt.Errorf("%s does not list %s", path, name)
		}
		got, err := hashFile(filepath.Join(dir, name))
		if err != nil {
			return meta, err
		}
		if got != want {
			return meta, fmt.Errorf("%s does not match %s (%d bytes, sha256 %s; listed %d bytes, %s): an unfinished or mixed save",
				name, CheckpointMeta, got.Bytes, got.SHA256, want.Bytes, want.SHA256)
		}
	}
	return meta, nil
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// syncAndHash fsyncs the file at path and returns its size and SHA-256.
func syncAndHash(path string) (checkpointFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return checkpointFile{}, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return checkpointFile{}, err
	}
	return hashReader(f)
}

func hashFile(path string) (checkpointFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return checkpointFile{}, err
	}
	defer f.Close()
	return hashReader(f)
}

func hashReader(r io.Reader) (checkpointFile, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return checkpointFile{}, err
	}
	return checkpointFile{Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
