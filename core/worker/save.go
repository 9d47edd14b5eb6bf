package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/internal/dirs"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Checkpoints, the save on ShutdownWithSave, and evaluation: the commands
// that ask the trainer (and averager) for their state rather than train.
// The saving itself is the supervisor's (supervisor.save).

// checkpoint saves into the Checkpoint's dir and answers CheckpointResult.
// A failed save is reported, not fatal: the coordinator decides.
func (w *worker) checkpoint(ctx context.Context, m *wirepb.Checkpoint) error {
	start := time.Now()
	files, err := w.sup.save(ctx, m.GetDir())
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
	files, saveErr := w.sup.save(ctx, dir)
	res := &wirepb.CheckpointResult{Rank: w.o.Rank, Version: m.GetVersion(), ElapsedMs: plugin.Milliseconds(time.Since(start)), Files: files}
	if saveErr != nil {
		res.Error = saveErr.Error()
	} else {
		w.log.Info("saved on shutdown", "dir", dir, "files", len(files))
	}
	return errors.Join(saveErr, w.send(ctx, res))
}

// Each plugin saves into a folder of its own in the rank's checkpoint
// directory, so the trainer's and the averager's files never clash.
const (
	trainerDir  = "trainer"
	averagerDir = "averager"
)

// pluginDir is where a plugin restores from in the rank's checkpoint
// directory dir: its own folder, or dir itself for a checkpoint saved
// before the folders (its files beside the other plugin's).
func pluginDir(dir, folder string) string {
	if own := filepath.Join(dir, folder); dirs.NonEmpty(own) {
		return own
	}
	return dir
}

// takeParameters gives a replacement's new trainer the rank's state: the
// optimizer's from the last checkpoint, loaded with LoadReplacement, and
// the parameters from the arena, which holds newer ones (newer, the
// arena's bytes before the new trainer attached). When the parameters
// died with the lost trainer's device block (blockLost) it resumes from
// the checkpoint instead.
func (s *supervisor) takeParameters(ctx context.Context, newer []byte, blockLost bool) error {
	keepsCheckpoint := blockLost
	if dir := s.checkpointToRestore(); dir != "" {
		reason := plugin.LoadReplacement
		if blockLost {
			reason = plugin.LoadResume
		}
		res, err := s.loadTrainer(ctx, dir, reason)
		if err != nil {
			return fmt.Errorf("restore from %s: %w", dir, err)
		}
		keepsCheckpoint = keepsCheckpoint || res.CheckpointParams
		if !plugin.KnowsLoadReason(s.trainer) {
			// A plugin older than the load reason loaded as for a resume,
			// into the arena too if its model lives there.
			copy(s.arena.Bytes(), newer)
		}
		s.log.Info("new trainer restored its optimizer state from the last checkpoint", "dir", dir, "step_count", res.StepCount)
	} else {
		s.log.Warn("new trainer starts its optimizer fresh: this rank has no checkpoint to restore it from")
	}
	switch {
	case !keepsCheckpoint:
		norm, err := s.trainer.Adopt(ctx, 0)
		if err != nil {
			return fmt.Errorf("adopt the arena's parameters: %w", err)
		}
		s.log.Info("new trainer took the arena's parameters", "param_norm", norm)
	case !blockLost:
		// The trainer cannot use the arena's values: the arena takes its.
		pub, err := s.trainer.Publish(ctx)
		if err != nil {
			return fmt.Errorf("publish the checkpoint's parameters: %w", err)
		}
		s.log.Warn("new trainer keeps the checkpoint's parameters: it cannot use the arena's", "param_norm", pub.ParamNorm)
	}
	return nil
}

// evaluate runs the trainer's evaluation and answers EvalResult; a failure
// is reported (NaN loss and the error), not fatal.
func (w *worker) evaluate(ctx context.Context, m *wirepb.Evaluate) error {
	start := time.Now()
	var r plugin.EvalResult
	err := w.sup.withTrainer(ctx, func(t plugin.Trainer) (err error) {
		r, err = t.Evaluate(ctx)
		return err
	})
	res := &wirepb.EvalResult{Rank: w.o.Rank, ScheduleId: m.GetScheduleId(), Epoch: m.GetEpoch(), ElapsedMs: plugin.Milliseconds(time.Since(start))}
	if err != nil {
		w.log.Error("evaluation failed", "epoch", m.GetEpoch(), "error", err)
		res.Loss, res.Error = math.NaN(), err.Error()
	} else {
		res.Loss, res.Accuracy, res.Samples = r.Loss, r.Accuracy, r.Samples
	}
	return w.send(ctx, res)
}
