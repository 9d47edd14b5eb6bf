package worker

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Checkpoints, the save on ShutdownWithSave, and evaluation: the commands
// that ask the trainer (and averager) for their state rather than train.
// The saving itself is core/worker/supervisor's (Supervisor.Save).

// checkpoint saves into the Checkpoint's dir and answers CheckpointResult.
// A failed save is reported, not fatal: the coordinator decides.
func (w *worker) checkpoint(ctx context.Context, m *wirepb.Checkpoint) error {
	start := time.Now()
	files, err := w.sup.Save(ctx, m.GetDir())
	res := &wirepb.CheckpointResult{Rank: w.o.Rank, Version: m.GetVersion(), ElapsedMs: plugin.Milliseconds(time.Since(start)), Files: files}
	if err != nil {
		w.log.Error("checkpoint failed", "version", m.GetVersion(), "error", err)
		res.Error = err.Error()
	}
	return w.send(ctx, res)
}

// shutdownWithSave saves into dir/rank-<r> and answers CheckpointResult.
// An empty dir asks for no save. A failed save is reported to the
// coordinator and returned.
func (w *worker) shutdownWithSave(ctx context.Context, m *wirepb.ShutdownWithSave) error {
	w.saved = true
	if m.GetDir() == "" {
		w.log.Info("shutdown with save names no directory: nothing saved")
		return nil
	}
	start := time.Now()
	dir := filepath.Join(m.GetDir(), "rank-"+strconv.FormatUint(uint64(w.o.Rank), 10))
	files, saveErr := w.sup.Save(ctx, dir)
	res := &wirepb.CheckpointResult{Rank: w.o.Rank, Version: m.GetVersion(), ElapsedMs: plugin.Milliseconds(time.Since(start)), Files: files}
	if saveErr != nil {
		res.Error = saveErr.Error()
	} else {
		w.log.Info("saved on shutdown", "dir", dir, "files", len(files))
	}
	return errors.Join(saveErr, w.send(ctx, res))
}

// evaluate runs the trainer's evaluation and answers EvalResult; a failure
// is reported (NaN loss and the error), not fatal.
func (w *worker) evaluate(ctx context.Context, m *wirepb.Evaluate) error {
	start := time.Now()
	var r plugin.EvalResult
	err := w.sup.WithTrainer(ctx, func(t plugin.Trainer) (err error) {
		r, err = t.Evaluate(ctx)
		return err
	})
	res := &wirepb.EvalResult{Rank: w.o.Rank, ScheduleId: m.GetScheduleId(), Epoch: m.GetEpoch(), ElapsedMs: plugin.Milliseconds(time.Since(start))}
	if err != nil {
		w.log.Error("evaluation failed", "epoch", m.GetEpoch()+1, "error", err)
		res.Loss, res.Error = math.NaN(), err.Error()
	} else {
		res.Loss, res.Accuracy, res.Samples = r.Loss, r.Accuracy, r.Samples
	}
	return w.send(ctx, res)
}
