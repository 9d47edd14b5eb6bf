package record

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
)

// DeathsDir holds, in the run's out directory, one DeathRecord per rank the
// run lost: rank-<N>.json.
const DeathsDir = "deaths"

// DeathRecord is what the coordinator knew of a rank when it declared it
// dead. It is written to OUT/deaths/rank-<N>.json at once, so a run that
// crashes later still leaves it, and summary.json's rank carries it.
type DeathRecord struct {
	// RunID tells this run's records from those an earlier run left in the
	// same out directory (one resumed, or forced into it).
	RunID  string    `json:"run_id"`
	Rank   uint32    `json:"rank"`
	Time   time.Time `json:"time"`
	Epoch  uint64    `json:"epoch"` // from 1, as the console numbers it
	Phase  string    `json:"phase"` // where the run stood, as the status page says it
	Reason string    `json:"reason"`
	// StepCount is the optimizer step count of the rank's last Batch
	// report; Batches and Samples are what its reports said it trained in
	// this run.
	StepCount uint64 `json:"step_count"`
	Batches   uint64 `json:"batches"`
	Samples   uint64 `json:"samples"`
	// Unfinished is the work taken back from it: the part of each plan it
	// held that its Batch reports do not cover, and its undispatched
	// partition.
	Unfinished []dispatch.Range `json:"unfinished"`
	// Redistributed is where that work went: each piece extended
	// (ExtendPartition) to a survivor. Empty when the run saved or ended
	// instead, as below min_ranks: the checkpoint's remaining samples then
	// hold it.
	Redistributed []dispatch.Handoff `json:"redistributed"`
}

// NewDeath starts the death record of the rank ev declares dead, as the
// run stands (in phase, the status page's word for it);
// Redistributed is filled in as its work is handed out.
func (r *Recorder) NewDeath(ev MembershipEvent, phase string, unfinished []dispatch.Range) *DeathRecord {
	rs := &r.ranks[ev.Rank]
	return &DeathRecord{
		RunID: r.cfg.RunID, Rank: ev.Rank, Time: ev.Time.UTC(), Epoch: ev.Epoch, Phase: phase, Reason: ev.Reason,
		StepCount: rs.stepCount, Batches: rs.batches, Samples: rs.samples,
		Unfinished: append([]dispatch.Range{}, unfinished...), Redistributed: []dispatch.Handoff{},
	}
}

// KeepDeath keeps a rank's death record for the summary and writes it to
// the out directory; a failed write is logged, and the run goes on.
func (r *Recorder) KeepDeath(d *DeathRecord) {
	r.ranks[d.Rank].death = d
	if err := r.writeDeath(d); err != nil {
		r.log.Warn("writing the rank's death record failed", "rank", d.Rank, "error", err)
	}
}

func (r *Recorder) writeDeath(d *DeathRecord) error {
	dir := filepath.Join(r.cfg.Out, DeathsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return WriteJSON(filepath.Join(dir, fmt.Sprintf("rank-%d.json", d.Rank)), d)
}
