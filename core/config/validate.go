package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/cohortdl/cohort/shared/mtls"
)

// MinHeartbeatTimeout is the shortest coordinator.heartbeat_timeout: ranks
// heartbeat once a second.
const MinHeartbeatTimeout = time.Second

var pluginName = regexp.MustCompile(`^[a-z0-9_-]+$`)

// Validate checks every value and returns all the problems found, one a
// line, each an *Error naming the key and where its value came from. Parse
// and Apply call it; call it again after changing a Config by hand.
func (c *Config) Validate() error {
	var errs errList
	bad := func(key, format string, args ...any) {
		errs.add(c.at(key), key, fmt.Sprintf(format, args...))
	}
	atLeast := func(key string, v, min int) {
		if v < min {
			bad(key, "must be at least %d, got %d", min, v)
		}
	}
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			bad(key, "must be a positive duration, got %v", d)
		}
	}

	atLeast("run.ranks", c.Run.Ranks, 1)
	atLeast("run.epochs", c.Run.Epochs, 1)

	co := c.Coordinator
	if err := checkHostPort(co.Listen); err != nil {
		bad("coordinator.listen", "%q is not host:port: %v", co.Listen, err)
	}
	if co.HTTP != "" {
		if err := checkHostPort(co.HTTP); err != nil {
			bad("coordinator.http", "%q is not host:port (or \"\" for no status server): %v", co.HTTP, err)
		}
	}
	if co.ReducePort < 0 || co.ReducePort > 65535 {
		bad("coordinator.reduce_port", "must be a port number, 0 to 65535, got %d", co.ReducePort)
	}
	if co.HeartbeatTimeout < MinHeartbeatTimeout {
		bad("coordinator.heartbeat_timeout", "must be at least %v, got %v", MinHeartbeatTimeout, co.HeartbeatTimeout)
	}
	positive("coordinator.formation_timeout", co.FormationTimeout)
	if !slices.Contains(Policies, co.Policy) {
		names := make([]string, len(Policies))
		for i, p := range Policies {
			names[i] = string(p)
		}
		bad("coordinator.policy", "%q is not one of %s", co.Policy, strings.Join(names, ", "))
	}
	atLeast("coordinator.sync_every", co.SyncEvery, 1)
	if c.Run.Ranks >= 1 && (co.MinRanks < 1 || co.MinRanks > c.Run.Ranks) { // a bad ranks is reported above
		bad("coordinator.min_ranks", "%d is outside [1, run.ranks = %d]", co.MinRanks, c.Run.Ranks)
	}
	atLeast("coordinator.checkpoint_every", co.CheckpointEvery, 0)
	atLeast("coordinator.checkpoint_keep", co.CheckpointKeep, 0)
	c.checkEvalRank(bad)
	if co.EvalEvery < 0 {
		bad("coordinator.eval_every", "must be a number of epochs, or 0 to never evaluate, got %d", co.EvalEvery)
	}
	atLeast("coordinator.chunk_batches", co.ChunkBatches, 0)
	if !(co.OverheadTarget > 0 && co.OverheadTarget < 1) {
		bad("coordinator.overhead_target", "%g is outside (0, 1)", co.OverheadTarget)
	}
	if !(co.EASGDAlpha > 0 && co.EASGDAlpha <= 1) {
		bad("coordinator.easgd_alpha", "%g is outside (0, 1]", co.EASGDAlpha)
	}
	atLeast("coordinator.sync_every_min", co.SyncEveryMin, 1)
	atLeast("coordinator.sync_every_max", co.SyncEveryMax, 0)
	if mx := co.SyncEveryMax; mx > 0 && (mx < co.SyncEveryMin || mx < co.SyncEvery) {
		bad("coordinator.sync_every_max", "%d is below sync_every_min (%d) or sync_every (%d)", mx, co.SyncEveryMin, co.SyncEvery)
	}
	if co.SyncEveryMin > co.SyncEvery && co.SyncEvery >= 1 {
		bad("coordinator.sync_every_min", "%d is above sync_every (%d)", co.SyncEveryMin, co.SyncEvery)
	}
	if !(co.DivergenceTarget >= 0) || math.IsInf(co.DivergenceTarget, 0) {
		bad("coordinator.divergence_target", "%g: want 0 (the default for the trainer's optimizer) or a finite number above 0", co.DivergenceTarget)
	}
	if !(co.GuardFactor == 0 || co.GuardFactor > 1) || math.IsInf(co.GuardFactor, 0) {
		bad("coordinator.guard_factor", "%g: want 0 (no guard) or a finite number above 1", co.GuardFactor)
	}
	if !(co.GuardLRFactor > 0 && co.GuardLRFactor <= 1) {
		bad("coordinator.guard_lr_factor", "%g is outside (0, 1]", co.GuardLRFactor)
	}
	atLeast("coordinator.lr_plateau_patience", co.LRPlateauPatience, 0)
	if !(co.LRPlateauFactor > 0 && co.LRPlateauFactor < 1) {
		bad("coordinator.lr_plateau_factor", "%g is outside (0, 1)", co.LRPlateauFactor)
	}
	atLeast("coordinator.max_batch_diff", co.MaxBatchDiff, 0)

	c.checkTLS("coordinator.tls", co.TLS, bad)

	w := c.Worker
	positive("worker.liveness_timeout", w.LivenessTimeout)
	positive("worker.connect_timeout", w.ConnectTimeout)
	if w.PluginDir == "" {
		bad("worker.plugin_dir", "must not be empty")
	}
	positive("worker.shutdown_grace", w.ShutdownGrace)
	atLeast("worker.plugin_restarts", w.PluginRestarts, 0)
	c.checkTLS("worker.tls", w.TLS, bad)

	for _, p := range []struct {
		key string
		*Plugin
	}{{"trainer", &c.Trainer}, {"averager", &c.Averager}} {
		if !pluginName.MatchString(p.Name) {
			bad(p.key, "%q is not a plugin name: use a-z, 0-9, _ and -", p.Name)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(p.Settings, &obj); err != nil || obj == nil {
			bad(p.key, "settings are not a JSON object")
		}
	}
	return errs.err()
}

// checkEvalRank checks that eval_rank is a policy or a rank of this run.
func (c *Config) checkEvalRank(bad func(key, format string, args ...any)) {
	co := c.Coordinator
	n, fixed := co.FixedEvalRank()
	switch {
	case co.EvalRank == EvalRankLowest || co.EvalRank == EvalRankFastest:
	case !fixed:
		bad("coordinator.eval_rank", "%q is not %s, %s or a rank number", co.EvalRank, EvalRankLowest, EvalRankFastest)
	case c.Run.Ranks >= 1 && int64(n) >= int64(c.Run.Ranks): // a bad ranks is reported above
		bad("coordinator.eval_rank", "rank %d is not in the run: run.ranks = %d numbers them 0 to %d", n, c.Run.Ranks, c.Run.Ranks-1)
	}
}

// checkTLS loads a tls block's files as the handshake will, so a missing,
// unreadable or mismatched file is reported at load, on the key that named
// it (on the block when a key is missing).
func (c *Config) checkTLS(block string, f mtls.Files, bad func(key, format string, args ...any)) {
	if !f.Enabled() {
		return
	}
	err := f.Check()
	var fe *mtls.FileError
	switch {
	case err == nil:
	case errors.As(err, &fe) && fe.Path == "": // a key left out
		bad(block, "%v", fe.Err)
	case errors.As(err, &fe):
		bad(block+"."+fe.Field, "%v", err)
	default:
		bad(block, "%v", err)
	}
}

// at says where key's value came from: its line in the file, the flag that
// set it, or else the file (or nothing) for a default.
func (c *Config) at(key string) hcl.Range {
	if r, ok := c.where[key]; ok {
		return r
	}
	return hcl.Range{Filename: c.Path}
}

func checkHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if ae, ok := err.(*net.AddrError); ok {
		return errors.New(ae.Err)
	} else if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number in [0, 65535]", port)
	}
	return nil
}
