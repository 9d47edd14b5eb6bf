package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
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
	if err := record.WriteJSON(filepath.Join(tmp, MetaFile), m); err != nil {
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

// progress is where training stands at a point all ranks' models agree on
// (the last completed round, or an epoch boundary): the samples of the
// epoch not yet averaged into the model, per rank and shared, with the
// controller's state as of the last round and the window it handed (or
// will hand) first after the snapshot.
type progress struct {
	dispatch.Snapshot
	partial record.EpochProgress
}

// progressNow is the state of the epoch as the models of the last round
// see it: everything not yet dispatched plus every plan still open.
func (r *runner) progressNow() progress {
	p := progress{Snapshot: r.disp.Snapshot(r.live())}
	if !r.disp.Training() {
		return p
	}
	p.partial = r.rep.Partial()
	return p
}

// ckptWait is a checkpoint (or a ShutdownWithSave) being written.
type ckptWait struct {
	version  uint64
	tmp      string
	pending  map[uint32]bool
	saved    []uint32
	progress progress
	reason   string
	resolved bool
}

// beginCheckpoint asks every live rank to save into its directory of a
// new checkpoint.
func (r *runner) beginCheckpoint() {
	live := r.live()
	v, tmp, err := r.c.store.begin(live)
	if err != nil {
		r.log.Error("checkpoint skipped", "epoch", r.epoch, "error", err)
		r.nextEpoch()
		return
	}
	r.phase = phCheckpoint
	r.ckpt = &ckptWait{version: v, tmp: tmp, pending: map[uint32]bool{}, progress: r.snap, reason: ReasonCheckpoint}
	for _, id := range live {
		r.ckpt.pending[id] = true
		r.send(r.ranks[id], &wirepb.Checkpoint{Version: v, TargetRank: id, Dir: rankDir(tmp, id)})
	}
}

// beginSave sends ShutdownWithSave to every live rank: each saves into
// its rank-<r> of a new checkpoint and exits. The run ends with status
// once they have.
func (r *runner) beginSave(reason wirepb.ShutdownReason, metaReason, status string, err error) {
	if r.phase == phSaving || r.phase == phShutdown || r.phase == phDone {
		return
	}
	if r.ckpt != nil && !r.ckpt.resolved {
		r.c.store.abandon(r.ckpt.tmp)
		r.ckpt = nil
	}
	r.saveStatus, r.saveErr = status, err
	r.phase = phSaving
	r.exitDeadline = time.Now().Add(r.exitTimeout())
	live := r.live()
	v, tmp, berr := r.c.store.begin(live)
	if berr != nil {
		// Without a directory the ranks can only stop.
		r.log.Error("cannot save; stopping without a checkpoint", "error", berr)
		r.saveErr = fmt.Errorf("coordinator: save: %w", berr)
		r.saveStatus = record.StatusFailed
		r.phase = phShutdown
		r.broadcast(&wirepb.Shutdown{})
		return
	}
	r.save = &ckptWait{version: v, tmp: tmp, pending: map[uint32]bool{}, progress: r.snap, reason: metaReason}
	msg := &wirepb.ShutdownWithSave{Reason: reason, Dir: tmp, Version: v}
	for _, id := range live {
		r.save.pending[id] = true
		r.send(r.ranks[id], msg)
	}
	r.log.Info("ShutdownWithSave sent", "reason", reason.String(), "version", v, "ranks", live)
}

func (r *runner) onCheckpointResult(rs *rankState, m *wirepb.CheckpointResult) {
	if r.isExport(rs, m) {
		r.onExported(m)
		return
	}
	var w *ckptWait
	switch {
	case r.ckpt != nil && r.ckpt.version == m.GetVersion():
		w = r.ckpt
	case r.save != nil && r.save.version == m.GetVersion():
		w = r.save
	}
	if w == nil || !w.pending[rs.id] {
		r.log.Warn("ignoring an unexpected CheckpointResult", "rank", rs.id, "version", m.GetVersion())
		return
	}
	delete(w.pending, rs.id)
	if e := m.GetError(); e != "" {
		r.log.Error("a rank failed to save", "rank", rs.id, "version", w.version, "error", e)
	} else {
		w.saved = append(w.saved, rs.id)
	}
	r.settleCkpt(w)
}

// ckptRankGone stops waiting for a lost rank's save.
func (r *runner) ckptRankGone(w *ckptWait, rank uint32) {
	if w == nil {
		return
	}
	delete(w.pending, rank)
	r.settleCkpt(w)
}

// settleCkpt completes a checkpoint once no save is pending; after an
// epoch checkpoint the run moves on.
func (r *runner) settleCkpt(w *ckptWait) {
	if len(w.pending) > 0 || w.resolved {
		return
	}
	r.resolveCkpt(w)
	if w == r.ckpt {
		r.ckpt = nil
		if r.phase == phCheckpoint {
			r.nextEpoch()
		}
	}
}

// resolveCkpt commits w if any rank saved into it, else removes it.
func (r *runner) resolveCkpt(w *ckptWait) {
	w.resolved = true
	if len(w.saved) == 0 {
		r.log.Error("checkpoint abandoned: no rank saved", "version", w.version)
		if err := r.c.store.abandon(w.tmp); err != nil {
			r.log.Error("removing an abandoned checkpoint failed", "error", err)
		}
		return
	}
	sort.Slice(w.saved, func(i, j int) bool { return w.saved[i] < w.saved[j] })
	m := r.meta(w)
	path, err := r.c.store.commit(w.tmp, m)
	if err != nil {
		r.log.Error("checkpoint failed", "version", w.version, "error", err)
		r.c.store.abandon(w.tmp)
		return
	}
	r.lastCkpt = path
	r.log.Info("checkpoint complete", "path", path, "epoch", m.Epoch, "reason", w.reason)
	r.emit(Progress{Kind: ProgressCheckpoint, Checkpoint: path})
}

func (r *runner) meta(w *ckptWait) *Meta {
	p := w.progress
	m := &Meta{
		SchemaVersion: metaSchema,
		Version:       w.version,
		RunID:         r.c.runID,
		Reason:        w.reason,
		Time:          time.Now().UTC(),
		Seed:          r.cfg.Run.Seed,
		WorldSize:     r.world,
		Policy:        string(r.policy),
		Epochs:        r.cfg.Run.Epochs,
		PickSpace:     r.pickSpace,
		BatchSize:     r.batch,
		SavedRanks:    w.saved,
		Epoch:         p.Epoch,
		Pool:          p.Pool,
		Partial:       p.partial,
		Rounds:        r.rep.RoundsTotal(),
		GlobalStep:    r.disp.GlobalStep(),
		Finished:      r.rep.Finished(),
		Cadence:       r.disp.CadenceState(),
	}
	ctl, win := p.Controller, p.Window
	m.Controller, m.ControllerWindow = &ctl, &win
	ids := make([]uint32, 0, len(p.Remaining))
	for id := range p.Remaining {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		m.Remaining = append(m.Remaining, dispatch.RankRanges{Rank: id, Ranges: p.Remaining[id]})
	}
	return m
}
