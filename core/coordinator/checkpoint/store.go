package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/shared/atomicfile"
)

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
	head := *m
	head.Finished = []record.EpochSummary{}
	var epochs record.EpochSource = record.EpochList(m.Finished)
	if m.epochs != nil {
		epochs = m.epochs
	}
	if err := record.WriteJSONEpochs(filepath.Join(tmp, MetaFile), &head, "finished_epochs", epochs); err != nil {
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

// prune removes the oldest complete checkpoints beyond the newest keep
// (0 keeps all). An incomplete one (no meta.json) is left to
// openCkptStore's next cleanup or the user: it is not counted.
func (s *ckptStore) prune(keep int) error {
	if keep <= 0 {
		return nil
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("list checkpoints: %w", err)
	}
	type ckpt struct {
		version uint64
		path    string
	}
	var complete []ckpt
	for _, e := range entries {
		v, ok := ckptVersion(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		if _, err := os.Stat(filepath.Join(p, MetaFile)); err == nil {
			complete = append(complete, ckpt{v, p})
		}
	}
	sort.Slice(complete, func(i, j int) bool { return complete[i].version < complete[j].version })
	var errs []error
	for _, c := range complete[:max(0, len(complete)-keep)] {
		// meta.json first: a removal cut short leaves an incomplete
		// checkpoint, never one that looks complete but is not.
		if err := os.Remove(filepath.Join(c.path, MetaFile)); err != nil {
			errs = append(errs, fmt.Errorf("remove checkpoint %s: %w", c.path, err))
			continue
		}
		if err := os.RemoveAll(c.path); err != nil {
			errs = append(errs, fmt.Errorf("remove checkpoint %s: %w", c.path, err))
		}
	}
	return errors.Join(errs...)
}

// abandon removes a checkpoint that will not complete.
func (s *ckptStore) abandon(tmp string) error {
	if err := os.RemoveAll(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove incomplete checkpoint %s: %w", tmp, err)
	}
	return nil
}

// Progress is where training stands at a point all ranks' models agree on
// (the last completed round, or an epoch boundary): the samples of the
// epoch not yet averaged into the model, per rank and shared, with the
// controller's state as of the last round and the window it handed (or
// will hand) first after the snapshot, and what the epoch had done.
type Progress struct {
	dispatch.Snapshot
	Partial record.EpochProgress
}

// Run is what every meta.json of a run says of it.
type Run struct {
	RunID  string
	Seed   int64
	World  uint32
	Policy string
	Epochs int
}

// Totals is what a meta.json takes from the run when its checkpoint
// commits.
type Totals struct {
	PickSpace  uint64
	BatchSize  uint64
	Rounds     uint64 // the whole run's, a resumed run's earlier ones included
	GlobalStep uint64
	Finished   record.EpochSource
	Cadence    *dispatch.CadenceState
}

// Writer numbers, builds and commits a run's checkpoints, and removes the
// oldest beyond the number it keeps. Only the coordinator's loop calls it
// while the run runs.
type Writer struct {
	store *ckptStore
	run   Run
	keep  int
	log   hclog.Logger
	last  string
	// consEpochs is how many finished epochs the consensus file's epochs
	// file holds (WriteConsensus).
	consEpochs int
}

// Open opens a run's checkpoints directory dir (OUT/checkpoints): it
// creates it if needed, numbers new checkpoints after the ones already
// there, and removes the temp directories a crash left behind, which it
// returns. Until the run commits one, the last complete checkpoint is
// whatever dir already holds. Each commit then leaves the newest keep
// complete checkpoints in dir (0: all).
func Open(dir string, run Run, keep int, log hclog.Logger) (*Writer, []string, error) {
	s, removed, err := openCkptStore(dir)
	if err != nil {
		return nil, nil, err
	}
	w := &Writer{store: s, run: run, keep: keep, log: log}
	w.last, _ = LastCheckpoint(dir)
	return w, removed, nil
}

// Last is the last complete checkpoint, "" for none.
func (w *Writer) Last() string { return w.last }

// Wait is a checkpoint (or a ShutdownWithSave) being written.
type Wait struct {
	version  uint64
	tmp      string
	pending  map[uint32]bool
	saved    []uint32
	progress Progress
	reason   string
	resolved bool
}

// Begin makes the directories of a new checkpoint of progress, for a
// Meta reason, and waits for the saves of ranks.
func (w *Writer) Begin(ranks []uint32, progress Progress, reason string) (*Wait, error) {
	v, tmp, err := w.store.begin(ranks)
	if err != nil {
		return nil, err
	}
	wt := &Wait{version: v, tmp: tmp, pending: map[uint32]bool{}, progress: progress, reason: reason}
	for _, id := range ranks {
		wt.pending[id] = true
	}
	return wt, nil
}

// Version is the checkpoint's number.
func (wt *Wait) Version() uint64 { return wt.version }

// Dir is the checkpoint's directory while it is built.
func (wt *Wait) Dir() string { return wt.tmp }

// RankDir is where rank saves into the checkpoint.
func (wt *Wait) RankDir(rank uint32) string { return rankDir(wt.tmp, rank) }

// Settled reports whether no save is pending and the checkpoint is not yet
// resolved.
func (wt *Wait) Settled() bool { return len(wt.pending) == 0 && !wt.resolved }

// Resolved reports whether Resolve has run.
func (wt *Wait) Resolved() bool { return wt.resolved }

// Gone stops waiting for a lost rank's save.
func (wt *Wait) Gone(rank uint32) { delete(wt.pending, rank) }

// Result takes rank's CheckpointResult for wt, whose error is errText
// ("" when it saved); false when wt waits for no save of rank.
func (w *Writer) Result(wt *Wait, rank uint32, errText string) bool {
	if !wt.pending[rank] {
		return false
	}
	delete(wt.pending, rank)
	if errText != "" {
		w.log.Error("a rank failed to save", "rank", rank, "version", wt.version, "error", errText)
	} else {
		wt.saved = append(wt.saved, rank)
	}
	return true
}

// Root is the rank whose saved model a run resumed from wt starts from:
// the lowest that saved (its rank 0 loads that rank's directory, and round
// 0 gives every rank its parameters). ok is false while none has saved.
func (wt *Wait) Root() (rank uint32, ok bool) {
	if len(wt.saved) == 0 {
		return 0, false
	}
	return slices.Min(wt.saved), true
}

// Holds records that the root's saved model holds, beyond wt's progress,
// what root trained since: a ShutdownWithSave taken between rounds. Those
// samples leave the remaining work and count in the epoch's figures, so
// a resumed run trains each sample once.
func (wt *Wait) Holds(root uint32, spans []dispatch.Span) { wt.progress.holds(root, spans) }

// holds takes rank's spans of p's epoch out of its remaining work and
// counts them in its figures, as rank's share.
func (p *Progress) holds(rank uint32, spans []dispatch.Span) {
	spans = slices.DeleteFunc(slices.Clone(spans), func(s dispatch.Span) bool { return s.Epoch != p.Epoch })
	if len(spans) == 0 {
		return
	}
	p.Snapshot = p.Snapshot.Without(dispatch.Ranges(spans))
	ranks := maps.Clone(p.Partial.Ranks)
	if ranks == nil {
		ranks = map[uint32]record.RankShare{}
	}
	sh := ranks[rank]
	for _, s := range spans {
		p.Partial.Samples += s.Size
		p.Partial.Batches += s.Batches
		sh.Samples += s.Size
		sh.Batches += s.Batches
	}
	ranks[rank] = sh
	p.Partial.Ranks = ranks
}

// Abandon removes a checkpoint that will not complete.
func (w *Writer) Abandon(wt *Wait) { w.store.abandon(wt.tmp) }

// Resolve commits wt if any rank saved into it, else removes it; path is
// the checkpoint, "" when there is none.
func (w *Writer) Resolve(wt *Wait, t Totals) (path string) {
	wt.resolved = true
	if len(wt.saved) == 0 {
		w.log.Error("checkpoint abandoned: no rank saved", "version", wt.version)
		if err := w.store.abandon(wt.tmp); err != nil {
			w.log.Error("removing an abandoned checkpoint failed", "error", err)
		}
		return ""
	}
	sort.Slice(wt.saved, func(i, j int) bool { return wt.saved[i] < wt.saved[j] })
	m := w.meta(wt, t)
	path, err := w.store.commit(wt.tmp, m)
	if err != nil {
		w.log.Error("checkpoint failed", "version", wt.version, "error", err)
		w.store.abandon(wt.tmp)
		return ""
	}
	w.last = path
	w.log.Info("checkpoint complete", "path", path, "resumes_at_epoch", m.Epoch+1, "reason", wt.reason)
	if err := w.store.prune(w.keep); err != nil {
		// The new checkpoint is complete: a resume has what it needs.
		w.log.Warn("removing old checkpoints failed", "keep", w.keep, "error", err)
	}
	return path
}

func (w *Writer) meta(wt *Wait, t Totals) *Meta {
	p := wt.progress
	m := &Meta{
		SchemaVersion: metaSchema,
		Version:       wt.version,
		RunID:         w.run.RunID,
		Reason:        wt.reason,
		Time:          time.Now().UTC(),
		Seed:          w.run.Seed,
		WorldSize:     w.run.World,
		Policy:        w.run.Policy,
		Epochs:        w.run.Epochs,
		PickSpace:     t.PickSpace,
		BatchSize:     t.BatchSize,
		SavedRanks:    wt.saved,
		Epoch:         p.Epoch,
		Pool:          p.Pool,
		Partial:       p.Partial,
		Rounds:        t.Rounds,
		GlobalStep:    t.GlobalStep,
		Cadence:       t.Cadence,
		epochs:        t.Finished,
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
