package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cohortdl/cohort/internal/dirs"
	"github.com/cohortdl/cohort/shared/plugin"
)

// A checkpoint goes through Save, loadTrainer and loadAverager alone, so
// what a plugin is told when it loads one, or which folder each plugin
// saves into, changes here.

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

// loadTrainer has the trainer load the checkpoint in dir for reason: the
// one place it does, at resume and when a fresh trainer replaces a lost
// one.
func (s *Supervisor) loadTrainer(ctx context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	return s.trainer.LoadCheckpoint(ctx, pluginDir(dir, trainerDir), reason)
}

// loadAverager has the averager load its state from the checkpoint in
// dir: the one place it does, at resume and when replaced.
func (s *Supervisor) loadAverager(ctx context.Context, dir string) error {
	return s.averager.LoadState(ctx, pluginDir(dir, averagerDir))
}

// Save writes the trainer's checkpoint and the averager's state into
// their folders in dir: the one place a checkpoint is saved. A trainer
// lost during it is replaced and asked again.
func (s *Supervisor) Save(ctx context.Context, dir string) ([]string, error) {
	if dir == "" {
		return nil, errors.New("save checkpoint: no directory given")
	}
	if !s.trainerReady {
		return nil, errors.New("save checkpoint: the trainer is not set up")
	}
	tdir, adir := filepath.Join(dir, trainerDir), filepath.Join(dir, averagerDir)
	for _, d := range []string{tdir, adir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("save checkpoint: %w", err)
		}
	}
	var files []string
	err := s.WithTrainer(ctx, func(t plugin.Trainer) (err error) {
		files, err = t.SaveCheckpoint(ctx, tdir)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("save checkpoint into %s: %w", tdir, err)
	}
	// The averager's own state (an outer optimizer's momentum) belongs to
	// the same checkpoint, or a resumed run would not continue the same way.
	if a := s.avg.Load(); a != nil {
		more, err := (*a).SaveState(ctx, adir)
		if err != nil {
			return nil, fmt.Errorf("save averager state into %s: %w", adir, err)
		}
		files = append(files, more...)
	}
	s.lastSave = dir
	return files, nil
}

// checkpointToRestore is the directory of the rank's last save, if it
// still holds files. The coordinator saves into a temporary directory and
// renames it into place once complete (docs/protocol.md, "Checkpoints and
// stopping"), so a save under .tmp-<name> is looked for under <name>.
func (s *Supervisor) checkpointToRestore() string {
	dir := s.lastSave
	if dir == "" {
		return ""
	}
	parent := filepath.Dir(dir)
	if name, ok := strings.CutPrefix(filepath.Base(parent), ".tmp-"); ok {
		committed := filepath.Join(filepath.Dir(parent), name, filepath.Base(dir))
		if dirs.NonEmpty(committed) {
			return committed
		}
	}
	if dirs.NonEmpty(dir) {
		return dir
	}
	return ""
}

// takeParameters gives a replacement's new trainer the rank's state: the
// optimizer's from the last checkpoint, loaded with LoadReplacement, and
// the parameters from the arena, which holds newer ones (newer, the
// arena's bytes before the new trainer attached). When the parameters
// died with the lost trainer's device block (blockLost) it resumes from
// the checkpoint instead.
func (s *Supervisor) takeParameters(ctx context.Context, newer []byte, blockLost bool) error {
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
