package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// ModelDir is where a completed run keeps its trained model, under the out
// directory: what the trainer's SaveCheckpoint writes for one rank (the
// libtorch trainer's includes model.pt, a TorchScript module).
const ModelDir = "model"

// ExportVersion is the Checkpoint version of the model export: checkpoint
// versions start at 1, so a CheckpointResult of version 0 answers it.
const ExportVersion = 0

// Export is the trained model's export after the last epoch: one rank
// saves its model into a temp directory beside OUT/model (it reuses the
// Checkpoint message, so ranks and trainers need nothing new), and the
// export moves it into place.
type Export struct {
	out   string
	log   hclog.Logger
	rank  int64  // the rank saving the trained model; -1: none
	model string // the trained model's directory, once kept
}

// NewExport is the export of a run whose out directory is out.
func NewExport(out string, log hclog.Logger) *Export {
	return &Export{out: out, log: log, rank: -1}
}

func (e *Export) tmp() string { return filepath.Join(e.out, "."+ModelDir+".tmp") }

// Begin readies the directory rank target saves the model into and
// returns it; false when it cannot be readied, and the model is not kept.
func (e *Export) Begin(target uint32) (string, bool) {
	tmp := e.tmp()
	if err := os.RemoveAll(tmp); err != nil {
		e.log.Warn("the trained model is not kept", "error", err)
		return "", false
	}
	e.rank = int64(target)
	return tmp, true
}

// Answers reports whether rank's CheckpointResult answers the export.
func (e *Export) Answers(rank uint32, m *wirepb.CheckpointResult) bool {
	return int64(rank) == e.rank && m.GetVersion() == ExportVersion
}

// Done moves the saved model into place; it returns its directory, ""
// when the rank could not save it or it could not be moved.
func (e *Export) Done(m *wirepb.CheckpointResult) string {
	e.rank = -1
	tmp := e.tmp()
	dir := filepath.Join(e.out, ModelDir)
	err := error(nil)
	if msg := m.GetError(); msg != "" {
		err = fmt.Errorf("rank %d could not save it: %s", m.GetRank(), msg)
	} else if err = os.RemoveAll(dir); err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		e.log.Warn("the trained model is not kept", "error", err)
		os.RemoveAll(tmp)
		return ""
	}
	e.model = dir
	e.log.Info("trained model kept", "dir", dir, "rank", m.GetRank())
	return dir
}

// RankGone ends the export whose rank was lost, and reports whether it
// did: the run completed, without its model.
func (e *Export) RankGone(rank uint32) bool {
	if int64(rank) != e.rank {
		return false
	}
	e.rank = -1
	os.RemoveAll(e.tmp())
	e.log.Warn("the trained model is not kept: its rank was lost", "rank", rank)
	return true
}

// Model is the trained model's directory, "" until it is kept.
func (e *Export) Model() string { return e.model }
