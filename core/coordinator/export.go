package coordinator

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// ModelDir is where a completed run keeps its trained model, under the out
// directory: what the trainer's SaveCheckpoint writes for one rank (the
// libtorch trainer's includes model.pt, a TorchScript module).
const ModelDir = "model"

// exportVersion is the Checkpoint version of the model export: checkpoint
// versions start at 1, so a CheckpointResult of version 0 answers it.
const exportVersion = 0

// exportModel asks one rank to save its trained model into OUT/model after
// the last epoch: the eval role's rank, which evaluated it (the summary
// reports its accuracy), else the lowest live one. It reuses the Checkpoint message, so
// ranks and trainers need nothing new. The run shuts down once it is
// answered (or the rank is lost).
func (r *runner) exportModel() {
	live := r.live()
	if len(live) == 0 {
		r.shutdown()
		return
	}
	target := live[0]
	if slices.Contains(live, r.role) {
		target = r.role
	}
	tmp := filepath.Join(r.c.out, "."+ModelDir+".tmp")
	if err := os.RemoveAll(tmp); err != nil {
		r.log.Warn("the trained model is not kept", "error", err)
		r.shutdown()
		return
	}
	r.phase = phExport
	r.exportRank = int64(target)
	r.send(r.ranks[target], &wirepb.Checkpoint{Version: exportVersion, TargetRank: target, Dir: tmp})
	r.log.Info("exporting the trained model", "rank", target)
}

// isExport reports whether a CheckpointResult answers the model export.
func (r *runner) isExport(rs *rankState, m *wirepb.CheckpointResult) bool {
	return r.phase == phExport && int64(rs.id) == r.exportRank && m.GetVersion() == exportVersion
}

// onExported moves the saved model into place and ends the run.
func (r *runner) onExported(m *wirepb.CheckpointResult) {
	r.exportRank = -1
	tmp := filepath.Join(r.c.out, "."+ModelDir+".tmp")
	dir := filepath.Join(r.c.out, ModelDir)
	err := error(nil)
	if e := m.GetError(); e != "" {
		err = fmt.Errorf("rank %d could not save it: %s", m.GetRank(), e)
	} else if err = os.RemoveAll(dir); err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		r.log.Warn("the trained model is not kept", "error", err)
		os.RemoveAll(tmp)
	} else {
		r.model = dir
		r.log.Info("trained model kept", "dir", dir, "rank", m.GetRank())
		r.emit(Progress{Kind: ProgressModel, Model: dir})
	}
	r.shutdown()
}

// exportRankGone ends the export whose rank was lost: the run completed,
// without its model.
func (r *runner) exportRankGone(rank uint32) {
	if int64(rank) != r.exportRank {
		return
	}
	r.exportRank = -1
	os.RemoveAll(filepath.Join(r.c.out, "."+ModelDir+".tmp"))
	r.log.Warn("the trained model is not kept: its rank was lost", "rank", rank)
	r.shutdown()
}
