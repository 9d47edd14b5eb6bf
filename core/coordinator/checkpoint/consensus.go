package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// ConsensusFile, in a run's checkpoints directory, is what a coordinator
// that comes back needs beyond the last checkpoint: the state of the epoch
// as the cohort's last consensus holds it. The ranks keep the model
// itself; this file says what that model holds. The coordinator rewrites
// it at every round (and epoch, and checkpoint) and removes it when the
// run ends, so only a coordinator that died leaves it behind.
const ConsensusFile = "consensus.json"

// consensusEpochsFile holds the finished epochs' figures for the
// consensus file, written only when an epoch finishes: the consensus file
// itself, rewritten every round, stays the same size however long the
// run.
const consensusEpochsFile = "consensus-epochs.json"

// consensusEpochs is consensusEpochsFile's content.
type consensusEpochs struct {
	Finished []record.EpochSummary `json:"finished_epochs"`
}

// Consensus is ConsensusFile's content.
type Consensus struct {
	// Base is the last complete checkpoint when the file was written, ""
	// for none: a rank that starts fresh loads it.
	Base string `json:"base"`
	// Live are the ranks of the cohort at the consensus.
	Live []uint32 `json:"live"`
	// NextRound is the number the next round would have had: a coordinator
	// that comes back numbers on from it, so no round number repeats.
	NextRound uint64 `json:"next_round"`
	// Finished is how many finished epochs the state has: the epochs file
	// (written first) holds them, and may hold one more.
	Finished int `json:"finished"`
	// Last is the epoch's state as of the last round that completed,
	// Round that round's number.
	Round uint64 `json:"round"`
	Last  Meta   `json:"last"`
	// Pending, when set, is the state as of the round in flight, for a
	// rank on which it succeeded before the coordinator died: the work of
	// a windowed round is known when it is issued.
	Pending *PendingConsensus `json:"pending,omitempty"`
}

// PendingConsensus is the state a round in flight leaves once it
// succeeds.
type PendingConsensus struct {
	Round uint64 `json:"round"`
	State Meta   `json:"state"`
}

// State is the state a model holds whose last successful round is round,
// false when the file knows no such round.
func (c *Consensus) State(round uint64) (*Meta, bool) {
	switch {
	case c.Pending != nil && c.Pending.Round == round:
		m := c.Pending.State
		return &m, true
	case c.Round == round:
		m := c.Last
		return &m, true
	}
	return nil, false
}

// ConsensusAt is what the coordinator writes for one round: its number and
// the epoch's state as of it (progress, the run's totals).
type ConsensusAt struct {
	Round    uint64
	Progress Progress
	Totals   Totals
}

// WriteConsensus replaces the run's consensus file: last is the last
// completed round's state, pending the one in flight (nil for none). It is
// not synced: it serves a coordinator that died, on a machine that did
// not, and is rewritten every round.
func (w *Writer) WriteConsensus(last ConsensusAt, pending *ConsensusAt, live []uint32, nextRound uint64) error {
	if n := epochCount(last.Totals.Finished); n != w.consEpochs {
		path := filepath.Join(w.store.dir, consensusEpochsFile)
		if err := record.WriteJSONEpochs(path, &consensusEpochs{}, "finished_epochs", last.Totals.Finished); err != nil {
			return fmt.Errorf("write the consensus state's epochs: %w", err)
		}
		w.consEpochs = n
	}
	c := Consensus{Base: w.last, Live: slices.Clone(live), NextRound: nextRound, Round: last.Round, Finished: epochCount(last.Totals.Finished),
		Last: *w.meta(&Wait{progress: last.Progress, reason: ReasonConsensus}, last.Totals)}
	c.Last.Finished = nil
	if pending != nil {
		c.Pending = &PendingConsensus{Round: pending.Round,
			State: *w.meta(&Wait{progress: pending.Progress, reason: ReasonConsensus}, pending.Totals)}
		c.Pending.State.Finished = nil
	}
	data, err := json.Marshal(&c)
	if err != nil {
		return fmt.Errorf("write the consensus state: %w", err)
	}
	// One writer (the loop), so one temporary name, renamed into place: a
	// reader sees the old file or the new one.
	path := filepath.Join(w.store.dir, ConsensusFile)
	tmp := filepath.Join(w.store.dir, consensusTmp)
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write the consensus state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write the consensus state: %w", err)
	}
	return nil
}

// consensusTmp is where the consensus file is written before its rename.
const consensusTmp = "." + ConsensusFile + ".tmp"

// RemoveConsensus removes the run's consensus file: the run ended.
func (w *Writer) RemoveConsensus() error {
	var errs []error
	for _, name := range []string{ConsensusFile, consensusTmp, consensusEpochsFile} {
		if err := os.Remove(filepath.Join(w.store.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the consensus state: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ReadConsensus reads dir's consensus file (dir: a run's checkpoints
// directory); nil with no error when there is none.
func ReadConsensus(dir string) (*Consensus, error) {
	path := filepath.Join(dir, ConsensusFile)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var c Consensus
	if err := record.ReadJSON(path, "consensus state", &c); err != nil {
		return nil, err
	}
	var eps consensusEpochs
	if err := record.ReadJSON(filepath.Join(dir, consensusEpochsFile), "consensus state's epochs", &eps); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if c.Finished < 0 || len(eps.Finished) < c.Finished {
		return nil, fmt.Errorf("consensus state %s: %d finished epochs, its epochs file holds %d", path, c.Finished, len(eps.Finished))
	}
	c.Last.Finished = eps.Finished[:c.Finished]
	if c.Pending != nil {
		c.Pending.State.Finished = eps.Finished[:c.Finished]
	}
	if err := c.Last.validate(); err != nil {
		return nil, fmt.Errorf("consensus state %s: %w", path, err)
	}
	if c.Pending != nil {
		if err := c.Pending.State.validate(); err != nil {
			return nil, fmt.Errorf("consensus state %s, pending round: %w", path, err)
		}
	}
	return &c, nil
}

// Holds records that a model holds, beyond m, what rank trained of spans:
// those samples leave the remaining work and count in the epoch's figures
// (as rank's share), so that model trains each sample once.
func (m *Meta) Holds(rank uint32, spans []dispatch.Span) {
	p := Progress{Snapshot: dispatch.Snapshot{Epoch: m.Epoch, Remaining: map[uint32][]dispatch.Range{}, Pool: m.Pool}, Partial: m.Partial}
	for _, rr := range m.Remaining {
		p.Remaining[rr.Rank] = rr.Ranges
	}
	p.holds(rank, spans)
	m.Pool, m.Partial = p.Pool, p.Partial
	for i := range m.Remaining {
		m.Remaining[i].Ranges = p.Remaining[m.Remaining[i].Rank]
	}
}

func epochCount(s record.EpochSource) int {
	if s == nil {
		return 0
	}
	return s.Len()
}
