package coordinator

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cohortdl/cohort/shared/atomicfile"
)

// Run statuses in a Summary.
const (
	StatusCompleted = "completed" // every epoch trained
	StatusFailed    = "failed"    // the run ended early on an error
	StatusStopped   = "stopped"   // Stop was called: saved and stopped
)

// Rank states in a Summary.
const (
	RankExited = "exited" // sent Exiting: a clean exit
	RankDead   = "dead"   // lost: its link broke or it fell silent
)

// SummaryFile is the summary's name in the run's out directory.
const SummaryFile = "summary.json"

// Summary is what a run did; every run writes one to OUT/summary.json.
type Summary struct {
	Status      string    `json:"status"`
	Error       string    `json:"error,omitempty"`
	RunID       string    `json:"run_id"`
	WorldSize   int       `json:"world_size"`
	Policy      string    `json:"policy"`
	Trainer     string    `json:"trainer"`
	Averager    string    `json:"averager"`
	ResumedFrom string    `json:"resumed_from,omitempty"`
	Started     time.Time `json:"started"`
	Seconds     float64   `json:"seconds"`
	GlobalStep  uint64    `json:"global_step"`
	// Epochs lists every finished epoch of the run, including those a
	// resumed run inherited from its checkpoint.
	Epochs           []EpochSummary    `json:"epochs"`
	Ranks            []RankSummary     `json:"ranks"`
	MembershipEvents []MembershipEvent `json:"membership_events"`
	Averaging        AveragingSummary  `json:"averaging"`
	// Checkpoint is the last complete checkpoint directory, if any.
	Checkpoint string `json:"checkpoint"`
}

// EpochSummary is one finished epoch.
type EpochSummary struct {
	Epoch uint64 `json:"epoch"`
	// Loss is the training loss, the batch-weighted mean of every rank's
	// Metrics for the epoch.
	Loss     float64  `json:"loss"`
	EvalLoss *float64 `json:"eval_loss,omitempty"`
	Accuracy *float64 `json:"accuracy,omitempty"`
	Seconds  float64  `json:"seconds"`
	Samples  uint64   `json:"samples"`
	Windows  uint64   `json:"windows"`
	Rounds   uint64   `json:"rounds"`
	// MeanRoundMS is the mean time from Sync to the last SyncAck.
	MeanRoundMS float64 `json:"mean_round_ms"`
	// WaitAtSyncMS is the mean time a rank waited at the sync barrier: from
	// the end of its work in a window to the window's Sync (async: its
	// time in the round beyond the fastest rank's). Averaged over every
	// (rank, window) pair in which the rank had work.
	WaitAtSyncMS float64     `json:"wait_at_sync_ms"`
	Ranks        []EpochRank `json:"ranks"`
}

// EpochRank is one rank's share of an epoch.
type EpochRank struct {
	Rank    uint32 `json:"rank"`
	Batches uint64 `json:"batches"`
	Samples uint64 `json:"samples"`
	// Windows counts the windows (or async chunks) in which it had work.
	Windows          uint64  `json:"windows"`
	BatchesPerWindow float64 `json:"batches_per_window"`
	WaitAtSyncMS     float64 `json:"wait_at_sync_ms"`
	// TrainMS is the time the rank's trainer says it spent in its batches
	// (getting each batch's data, then the step), summed from its Batch
	// reports: by the trainer's own clock, so its share of the epoch's
	// Seconds is how much of the epoch the rank trained, whatever the
	// machine's speed.
	TrainMS float64 `json:"train_ms"`
}

// RankSummary is one rank at the end of the run.
type RankSummary struct {
	Rank    uint32 `json:"rank"`
	State   string `json:"state"`
	Samples uint64 `json:"samples"`
	Batches uint64 `json:"batches"`
	Reason  string `json:"reason,omitempty"`
}

// MembershipEvent is a change of the cohort.
type MembershipEvent struct {
	Rank   uint32    `json:"rank"`
	Event  string    `json:"event"`
	Epoch  uint64    `json:"epoch"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// AveragingSummary describes the averaging rounds of this process (a
// resumed run counts its own; RoundsTotal adds the rounds before it).
type AveragingSummary struct {
	Backend     string  `json:"backend"`
	Rounds      uint64  `json:"rounds"`
	RoundsTotal uint64  `json:"rounds_total"`
	MeanRoundMS float64 `json:"mean_round_ms"`
	// BytesPerRound is the averaging data that crossed the network per
	// round: the coordinator's reduce server's bulk frames when it served
	// the rounds, else what the ranks' averagers report. It is 0 when every
	// rank shares the host, as they reduce in shared memory.
	BytesPerRound float64 `json:"bytes_per_round"`
}

// ReadSummary reads a run's summary.json.
func ReadSummary(path string) (*Summary, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read summary: %w", err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("read summary %s: %w", path, err)
	}
	return &s, nil
}

// writeJSONAtomic writes v as indented JSON to path, atomically, so a
// reader never sees half a file and a crash leaves the old one or the new.
func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return atomicfile.WriteBytes(path, append(b, '\n'))
}
