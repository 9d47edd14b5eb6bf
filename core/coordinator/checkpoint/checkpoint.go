// Package checkpoint is what a run keeps on disk to be resumed, and the
// model it leaves: checkpoints under OUT/checkpoints (ckpt-NNNNNN, one
// rank-<r> directory per rank that saved and meta.json, built in a temp
// directory and renamed into place complete), their Meta, finding the one
// to resume from, and the export of the trained model into OUT/model.
//
// A Writer numbers and builds a run's checkpoints: Begin makes the
// directories of a new one and tracks the ranks' saves into it (a Wait),
// Resolve commits meta.json once they are in. What goes into meta.json is
// handed to it (a Progress, the run's Totals): it reads no run state.
// Where things are:
//   - checkpoint.go: the layout, Meta and ReadMeta
//   - find.go: finding a complete checkpoint (LastCheckpoint,
//     ResolveCheckpoint)
//   - store.go: the Writer, its Waits, and how a checkpoint is committed
//   - export.go: the trained model's export
//   - consensus.go: the consensus file, the state of the cohort's last
//     consensus for a coordinator that comes back
//
// Neighbours: core/coordinator/dispatch (the work and the controller's and
// cadence's states a Meta holds) and core/coordinator/record (the epoch
// figures it holds) below; core/coordinator decides when to save.
package checkpoint

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
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
	// ReasonConsensus marks the states of the consensus file.
	ReasonConsensus = "consensus"
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
	Epoch     uint64                `json:"epoch"`
	Remaining []dispatch.RankRanges `json:"remaining"`
	Pool      []dispatch.Range      `json:"pool"`
	// Partial is what the epoch in progress had done before the save.
	Partial record.EpochProgress `json:"partial"`
	// Rounds and GlobalStep count the whole run so far.
	Rounds     uint64                 `json:"rounds"`
	GlobalStep uint64                 `json:"global_step"`
	Cadence    *dispatch.CadenceState `json:"cadence,omitempty"`
	// Controller is the controller's state as of the save point, and
	// ControllerWindow what the first window after it gets.
	Controller       *dispatch.ControllerState  `json:"controller,omitempty"`
	ControllerWindow *dispatch.ControllerWindow `json:"controller_window,omitempty"`
	Finished         []record.EpochSummary      `json:"finished_epochs"`
	// epochs, where set, are the finished epochs a checkpoint being
	// written streams into its meta.json in place of Finished: the
	// run's record, which keeps them on disk.
	epochs record.EpochSource
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
	if err := dispatch.CheckRanges(all, m.PickSpace); err != nil {
		return fmt.Errorf("remaining samples of epoch %d: %w", m.Epoch, err)
	}
	return nil
}

// ReadMeta reads and checks dir/meta.json.
func ReadMeta(dir string) (*Meta, error) {
	path := filepath.Join(dir, MetaFile)
	var m Meta
	if err := record.ReadJSON(path, "checkpoint meta", &m); err != nil {
		return nil, err
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint meta %s: %w", path, err)
	}
	return &m, nil
}
