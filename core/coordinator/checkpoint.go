package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/shared/atomicfile"
)

// Checkpoint layout: OUT/checkpoints/ckpt-NNNNNN, each holding one
// directory per rank that saved (rank-<r>) and meta.json. A checkpoint is
// built in a temp directory beside it and renamed into place only after
// meta.json is on disk, so a directory with that name is always complete.
const (
	CheckpointsDir = "checkpoints"
	MetaFile       = "meta.json"
	ckptPrefix     = "ckpt-"
	tmpPrefix      = ".tmp-" + ckptPrefix
	metaSchema     = 1
)

// Save reasons in a Meta.
const (
	ReasonCheckpoint  = "checkpoint"
	ReasonInterrupted = "interrupted"
	ReasonTooFewRanks = "too_few_ranks"
	ReasonStall       = "session_stall"
)

// Meta is a checkpoint's meta.json: what only the coordinator knows, and
// what a resumed run needs to continue at the same window boundary.
type Meta struct {
	SchemaVersion int       `json:"schema_version"`
	Version       uint64    `json:"version"`
	RunID         string    `json:"run_id"`
	Reason        string    `json:"reason"`
	Time          time.Time `json:"time"`
	Seed          int64     `json:"seed"`
	WorldSize     uint32    `json:"world_size"`
	Policy        string    `json:"policy"`
	Epochs        int       `json:"epochs"`
	PickSpace     uint64    `json:"pick_space"`
	BatchSize     uint64    `json:"batch_size"`
	// SavedRanks are the ranks whose rank-<r> directory holds their state.
	SavedRanks []uint32 `json:"saved_ranks"`
	// Epoch is the epoch to continue; Remaining and Pool are its samples not
	// yet averaged into the saved model: per rank (policy sync partitions)
	// and shared (cadence, async). Remaining lists exactly the ranks live at
	// the save.
	Epoch     uint64       `json:"epoch"`
	Remaining []RankRanges `json:"remaining"`
	Pool      []Range      `json:"pool"`
	// Partial is what the epoch in progress had done before the save.
	Partial EpochProgress `json:"partial"`
	// Rounds and GlobalStep count the whole run so far.
	Rounds     uint64         `json:"rounds"`
	GlobalStep uint64         `json:"global_step"`
	Cadence    *CadenceState  `json:"cadence,omitempty"`
	Finished   []EpochSummary `json:"finished_epochs"`
}

// RankRanges is one rank's share of the samples left in an epoch.
type RankRanges struct {
	Rank   uint32  `json:"rank"`
	Ranges []Range `json:"ranges"`
}

// EpochProgress is the running aggregate of an epoch in progress.
type EpochProgress struct {
	Samples uint64  `json:"samples"`
	Batches uint64  `json:"batches"`
	LossSum float64 `json:"loss_sum"` // Σ avg_loss·batches over Metrics with a finite loss
	// LossBatches are the batches LossSum covers.
	LossBatches uint64  `json:"loss_batches"`
	Seconds     float64 `json:"seconds"`
}

// validate checks what a resumed run relies on.
func (m *Meta) validate() error {
	switch {
	case m.SchemaVersion < 1 || m.SchemaVersion > metaSchema:
		return fmt.Errorf("schema_version %d, this build reads 1..%d", m.SchemaVersion, metaSchema)
	case m.PickSpace == 0:
		return errors.New("pick_space is 0")
	case m.Epochs < 1:
		return fmt.Errorf("epochs is %d", m.Epochs)
	}
	all := slices.Clone(m.Pool)
	seen := map[uint32]bool{}
	for _, rr := range m.Remaining {
		if seen[rr.Rank] {
			return fmt.Errorf("remaining lists rank %d twice", rr.Rank)
		}
		seen[rr.Rank] = true
		all = append(all, rr.Ranges...)
	}
	if err := checkRanges(all, m.PickSpace); err != nil {
		return fmt.Errorf("remaining samples of epoch %d: %w", m.Epoch, err)
	}
	return nil
}

// ReadMeta reads and checks dir/meta.json.
func ReadMeta(dir string) (*Meta, error) {
	path := filepath.Join(dir, MetaFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint meta: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("read checkpoint meta %s: %w", path, err)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint meta %s: %w", path, err)
	}
	return &m, nil
}

// ckptVersion parses a checkpoint directory name; ok is false for any
// other name.
func ckptVersion(name string) (uint64, bool) {
	s, found := strings.CutPrefix(name, ckptPrefix)
	if !found {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// LastCheckpoint returns the newest complete checkpoint in dir (a run's
// checkpoints directory): the highest-numbered ckpt-N holding meta.json.
func LastCheckpoint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("list checkpoints: %w", err)
	}
	best, found := uint64(0), ""
	for _, e := range entries {
		v, ok := ckptVersion(e.Name())
		if !ok || !e.IsDir() || (found != "" && v < best) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), MetaFile)); err != nil {
			continue
		}
		best, found = v, filepath.Join(dir, e.Name())
	}
	if found == "" {
		return "", fmt.Errorf("no complete checkpoint (a %sN directory holding %s) in %s", ckptPrefix, MetaFile, dir)
	}
	return found, nil
}

// ResolveCheckpoint turns what a user passes to --resume into a complete
// checkpoint directory: a checkpoint itself, a run's out directory, or its
// checkpoints directory (the last complete one in either).
func ResolveCheckpoint(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, MetaFile)); err == nil {
		return filepath.Abs(path)
	}
	dir := path
	if st, err := os.Stat(filepath.Join(path, CheckpointsDir)); err == nil && st.IsDir() {
		dir = filepath.Join(path, CheckpointsDir)
	}
	found, err := LastCheckpoint(dir)
	if err != nil {
		return "", fmt.Errorf("resume from %s: %w", path, err)
	}
	return filepath.Abs(found)
}

// ckptStore numbers, builds and commits checkpoints under one directory.
type ckptStore struct {
	dir  string
	next uint64
}

// openCkptStore creates dir if needed, numbers new checkpoints after the
// ones already there, and removes temp directories a crash left behind.
func openCkptStore(dir string) (*ckptStore, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("create checkpoints directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list checkpoints: %w", err)
	}
	s := &ckptStore{dir: dir, next: 1}
	var removed []string
	for _, e := range entries {
		if v, ok := ckptVersion(e.Name()); ok {
			s.next = max(s.next, v+1)
		}
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			p := filepath.Join(dir, e.Name())
			if err := os.RemoveAll(p); err != nil {
				return nil, nil, fmt.Errorf("remove incomplete checkpoint %s: %w", p, err)
			}
			removed = append(removed, p)
		}
	}
	return s, removed, nil
}

// begin makes the temp directory of the next checkpoint, with a rank-<r>
// directory for each rank that will save (ranks on this host would make
// them too; making them here keeps a rank's save a plain file write).
func (s *ckptStore) begin(ranks []uint32) (uint64, string, error) {
	v := s.next
	s.next++
	tmp := filepath.Join(s.dir, fmt.Sprintf("%s%06d", tmpPrefix, v))
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return 0, "", fmt.Errorf("create checkpoint %d: %w", v, err)
	}
	for _, r := range ranks {
		if err := os.MkdirAll(rankDir(tmp, r), 0o755); err != nil {
			os.RemoveAll(tmp)
			return 0, "", fmt.Errorf("create checkpoint %d: %w", v, err)
		}
	}
	return v, tmp, nil
}

func rankDir(ckpt string, rank uint32) string {
	return filepath.Join(ckpt, fmt.Sprintf("rank-%d", rank))
}

// commit writes meta.json into tmp (fsynced), renames tmp into place and
// fsyncs the parent, and returns the checkpoint's path.
func (s *ckptStore) commit(tmp string, m *Meta) (string, error) {
	final := filepath.Join(s.dir, fmt.Sprintf("%s%06d", ckptPrefix, m.Version))
	if err := writeJSONAtomic(filepath.Join(tmp, MetaFile), m); err != nil {
		return "", fmt.Errorf("checkpoint %d: %w", m.Version, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("checkpoint %d: %w", m.Version, err)
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return "", fmt.Errorf("checkpoint %d: %w", m.Version, err)
	}
	return final, nil
}

// abandon removes a checkpoint that will not complete.
func (s *ckptStore) abandon(tmp string) error {
	if err := os.RemoveAll(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove incomplete checkpoint %s: %w", tmp, err)
	}
	return nil
}
