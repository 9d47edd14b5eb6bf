package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/shared/atomicfile"
)

// Run statuses in a Summary.
const (
	StatusCompleted = "completed" // every epoch trained
	StatusFailed    = "failed"    // the run ended early on an error
	StatusStopped   = "stopped"   // Stop was called: saved and stopped
)

// Rank states in a Summary; a summary written while the run trains, and
// the status page, also say RankLive, and the status page the states
// before formation (RankAbsent, RankJoined, RankReady).
const (
	RankExited = "exited" // sent Exiting: a clean exit
	RankDead   = "dead"   // lost: its link broke or it fell silent
	RankLive   = "live"   // a member of the formed cohort
	RankAbsent = "absent" // no connection
	RankJoined = "joined" // handshake done, Admit sent
	RankReady  = "ready"  // Ready accepted, waiting for the others
)

// SummaryFile is the summary's name in the run's out directory.
const SummaryFile = "summary.json"

// Summary is what a run did; every run writes one to OUT/summary.json.
// Its first fields are the status snapshot's (core/status.Snapshot) field
// for field: two documents that open with the run's identity, one what a
// run leaves and one what the status page shows while it runs, each free
// to change without the other.
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
	// Roles lists the eval role's holders: the first at formation, then
	// every move (coordinator.eval_rank).
	Roles     []RoleElection   `json:"roles"`
	Averaging AveragingSummary `json:"averaging"`
	// Controller is what the sync-interval and learning-rate controller
	// did in this process.
	Controller *dispatch.ControllerSummary `json:"controller,omitempty"`
	// Checkpoint is the last complete checkpoint directory, if any.
	Checkpoint string `json:"checkpoint"`
	// Model is the trained model's directory (OUT/model) of a completed
	// run, when a rank saved it.
	Model string `json:"model,omitempty"`
}

// EpochSummary is one finished epoch. Like every JSON document's type in
// the tree it is a list of tagged fields, alike in shape to the others
// (a package manifest, a bench's figures) but a schema of its own.
type EpochSummary struct {
	// Epoch is the epoch's number, from 1, as the console shows it.
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
	// Scalars are the trainer's named figures (plugin.BatchReport.Scalars),
	// each the mean over every batch report of the epoch.
	Scalars map[string]float64 `json:"scalars,omitempty"`
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
	// RoundWaitMS is the time averaging rounds held the rank's training,
	// by its own clock: whole rounds when they block, an overlapped
	// round's publish, adopt and any wait for it (the async policy).
	RoundWaitMS float64 `json:"round_wait_ms"`
}

// RankSummary is one rank at the end of the run.
type RankSummary struct {
	Rank    uint32 `json:"rank"`
	State   string `json:"state"`
	Samples uint64 `json:"samples"`
	Batches uint64 `json:"batches"`
	Reason  string `json:"reason,omitempty"`
	// PluginRestarts counts the plugins the rank replaced after they died
	// or wedged.
	PluginRestarts uint32 `json:"plugin_restarts"`
	// Death is what the coordinator knew of the rank when it declared it
	// dead (also in OUT/deaths/rank-<N>.json).
	Death *DeathRecord `json:"death,omitempty"`
}

// MembershipEvent is a change of the cohort.
type MembershipEvent struct {
	Rank   uint32    `json:"rank"`
	Event  string    `json:"event"`
	Epoch  uint64    `json:"epoch"` // from 1, as the console and EpochSummary number it
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// MembershipEvent.Event values.
const (
	EventLeft = "left" // the rank said Exiting before the run ended
	EventDead = "dead" // its link broke or it fell silent
	// EventPluginRestarted: the rank replaced a plugin and lives on.
	EventPluginRestarted = "plugin_restarted"
)

// RoleElection is one change of the eval role: the rank that evaluates
// each epoch, runs the epoch callback and saves the trained model.
type RoleElection struct {
	// Epoch is the epoch, from 1, in which the role moved; a rank elected
	// at an epoch's end evaluates that epoch.
	Epoch uint64 `json:"epoch"`
	Rank  uint32 `json:"rank"`
	Why   string `json:"why"`
}

// RoleElection.Why values.
const (
	RoleFormed = "formed" // the cohort formed: coordinator.eval_rank's first pick
	RoleFaster = "faster" // eval_rank = fastest: a clearly faster rank took over
	RoleLost   = "lost"   // the holder left the cohort: eval_rank picked again among the live
)

// AveragingSummary describes the averaging rounds of this process (a
// resumed run counts its own; RoundsTotal adds the rounds before it).
type AveragingSummary struct {
	Backend     string  `json:"backend"`
	Rounds      uint64  `json:"rounds"`
	RoundsTotal uint64  `json:"rounds_total"`
	MeanRoundMS float64 `json:"mean_round_ms"`
	// BytesPerRound is the averaging data that crossed the network per
	// round: what the ranks' averagers report, or the coordinator's reduce
	// server's bulk frames where it counted more. The same figure, times
	// the rounds, is the status page's and metrics' bytes averaged.
	BytesPerRound float64 `json:"bytes_per_round"`
	// HostCopyBytes sums what the live ranks' trainers and averagers
	// reported copying between device and host memory for the rounds
	// (SyncAck.host_copy_bytes): 0 when parameters stay where they are
	// (on the host for CPU training; on the device for a device-resident
	// path).
	HostCopyBytes uint64 `json:"host_copy_bytes"`
}

// ReadSummary reads a run's summary.json.
func ReadSummary(path string) (*Summary, error) {
	var s Summary
	if err := ReadJSON(path, "summary", &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ReadJSON reads the JSON file at path, what the run calls a what, into
// v: WriteJSON's reader.
func ReadJSON(path, what string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("read %s %s: %w", what, path, err)
	}
	return nil
}

// WriteJSON writes v as indented JSON to path, atomically, so a reader
// never sees half a file and a crash leaves the old one or the new: how
// every file of a run's record is written (summary.json, deaths/, a
// checkpoint's meta.json).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return atomicfile.WriteBytes(path, append(b, '\n'))
}

// WriteJSONEpochs writes what WriteJSON writes for v with epochs as the
// value of its top-level field named field, v holding none there (it
// encodes as null or []). Each epoch is encoded on its own, straight to
// the file: a run rewrites its summary and its checkpoint's meta.json every
// epoch, and encoding every epoch at once took a buffer as large as the
// file, which the JSON encoder keeps for its next use, so the process
// held more memory the longer it ran.
func WriteJSONEpochs(path string, v any, field string, epochs EpochSource) error {
	head, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	if epochs == nil || epochs.Len() == 0 {
		return atomicfile.WriteBytes(path, append(head, '\n'))
	}
	key := []byte("\n  " + strconv.Quote(field) + ": ")
	at := bytes.Index(head, key)
	if at < 0 {
		return fmt.Errorf("encode %s: no top-level field %q", filepath.Base(path), field)
	}
	at += len(key)
	var empty int
	for _, e := range []string{"null", "[]"} {
		if bytes.HasPrefix(head[at:], []byte(e)) {
			empty = len(e)
		}
	}
	if empty == 0 {
		return fmt.Errorf("encode %s: field %q already holds a value", filepath.Base(path), field)
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		if _, err := w.Write(head[:at]); err != nil {
			return err
		}
		// One buffer for every epoch: a rewrite's garbage does not grow
		// with the run, nor each epoch's end raise the process's peak
		// heap, which its resident memory would keep.
		var buf bytes.Buffer
		sep := "[\n    "
		err := epochs.Each(func(e []byte) error {
			buf.Reset()
			buf.WriteString(sep)
			if err := json.Indent(&buf, e, "    ", "  "); err != nil {
				return fmt.Errorf("encode a finished epoch: %w", err)
			}
			sep = ",\n    "
			_, err := w.Write(buf.Bytes())
			return err
		})
		if err != nil {
			return err
		}
		if _, err := io.WriteString(w, "\n  ]"); err != nil {
			return err
		}
		_, err = w.Write(append(head[at+empty:], '\n'))
		return err
	})
}

// Summary builds the run's Summary as it stands now, every finished
// epoch read into it.
func (r *Recorder) Summary() *Summary {
	s := r.summaryHead()
	eps, err := Epochs(r.epochs)
	if err != nil {
		r.log.Warn("the run summary lacks finished epochs", "error", err)
	}
	if len(eps) > 0 {
		s.Epochs = eps
	}
	return s
}

// summaryHead is the Summary but its epochs ([]).
func (r *Recorder) summaryHead() *Summary {
	now := r.cfg.Source.Now()
	status := now.Status
	if !now.Done {
		status = StatusRunning
	}
	s := &Summary{
		Status:           status,
		RunID:            r.cfg.RunID,
		WorldSize:        int(r.cfg.World),
		Policy:           r.cfg.Policy,
		Trainer:          r.cfg.Trainer,
		Averager:         r.cfg.Averager,
		ResumedFrom:      r.cfg.ResumedFrom,
		Started:          r.cfg.Started.UTC(),
		Seconds:          time.Since(r.cfg.Started).Seconds(),
		GlobalStep:       r.cfg.Dispatch.GlobalStep(),
		Epochs:           []EpochSummary{},
		MembershipEvents: r.memberEvents,
		Controller:       r.cfg.Dispatch.ControllerSummary(),
		Roles:            r.roles,
		Checkpoint:       now.Checkpoint,
		Model:            now.Model,
		Averaging: AveragingSummary{
			Backend:     r.cfg.Averager,
			Rounds:      r.rounds,
			RoundsTotal: r.roundsBefore + r.rounds,
		},
	}
	if now.Err != nil {
		s.Error = now.Err.Error()
	}
	if s.MembershipEvents == nil {
		s.MembershipEvents = []MembershipEvent{}
	}
	if s.Roles == nil {
		s.Roles = []RoleElection{}
	}
	if r.rounds > 0 {
		s.Averaging.MeanRoundMS = safe(r.roundMS / float64(r.rounds))
		s.Averaging.BytesPerRound = safe(r.bytes / float64(r.rounds))
		s.Averaging.HostCopyBytes = r.hostCopy
	}
	for id, rs := range r.ranks {
		state := RankExited
		switch {
		case rs.state == RankLive && !now.Done:
			state = RankLive
		case rs.state != RankExited:
			// Anything but a clean exit is a loss, including a rank that
			// never joined.
			state = RankDead
		}
		reason := rs.reason
		if state == RankDead && reason == "" {
			if rs.state == RankAbsent || rs.state == RankJoined || rs.state == RankReady {
				reason = "never joined the cohort"
			} else {
				reason = "still connected when the run ended"
			}
		}
		s.Ranks = append(s.Ranks, RankSummary{Rank: uint32(id), State: state, Samples: rs.samples, Batches: rs.batches, Reason: reason,
			PluginRestarts: rs.pluginRestarts, Death: rs.death})
	}
	return s
}

// safe keeps a figure JSON can encode.
func safe(x float64) float64 {
	if !finite(x) {
		return 0
	}
	return x
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
