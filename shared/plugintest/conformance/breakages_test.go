package conformance_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// broken is the mock averager with one promise broken.
type broken struct {
	*plugintest.Averager
	bug string

	// inRound is held by Average for the whole round.
	inRound sync.Mutex

	mu       sync.Mutex
	mapping  *arena.Mapping
	world    uint32
	stateful bool // settings asked for state (the momentum key)
	rounds   int  // realized rounds: the state lost by losesState
}

// The bugs.
const (
	plainMean     = "plain mean"
	ignoresGamma  = "ignores gamma"
	weighsIdle    = "weighs idle ranks"
	abortIgnored  = "abort ignored"
	shutdownHangs = "shutdown hangs"
	losesState    = "loses state"
	falseSolo     = "false solo identity"
	noBug         = "none"
)

func (b *broken) Configure(ctx context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	var set map[string]any
	if len(cfg.Settings) > 0 {
		if err := json.Unmarshal(cfg.Settings, &set); err != nil {
			return plugin.AveragerTraits{}, err
		}
	}
	_, stateful := set["momentum"]
	delete(set, "momentum")
	if b.bug == ignoresGamma {
		delete(set, "gamma")
	}
	cfg.Settings, _ = json.Marshal(set)
	traits, err := b.Averager.Configure(ctx, cfg)
	if err != nil {
		return traits, err
	}
	m, err := arena.Open(cfg.Arena)
	if err != nil {
		return traits, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mapping, b.world, b.stateful, b.rounds = m, cfg.WorldSize, stateful, 0
	// State makes a lone round change the arena: no solo identity.
	traits.SoloIdentity = traits.SoloIdentity && !stateful
	return traits, nil
}

func (b *broken) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	b.inRound.Lock()
	defer b.inRound.Unlock()
	switch {
	case b.bug == plainMean && r.Steps > 0:
		r.Steps = 1
	case b.bug == weighsIdle && r.Steps == 0:
		r.Steps = 1
	}
	res, err := b.Averager.Average(ctx, r)
	if err != nil || !res.Realized {
		return res, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w, err := b.mapping.Float32s(0)
	if err != nil {
		return res, err
	}
	switch {
	case b.stateful:
		// An outer step that depends on the rounds so far.
		b.rounds++
		for k := range w {
			w[k] += 1e-3 * float32(b.rounds)
		}
	case b.bug == falseSolo && b.world == 1:
		w[0] = math.Nextafter32(w[0], float32(math.Inf(1)))
	}
	return res, nil
}

func (b *broken) Abort(ctx context.Context, reason string) error {
	if b.bug == abortIgnored {
		return nil
	}
	return b.Averager.Abort(ctx, reason)
}

func (b *broken) SaveState(ctx context.Context, dir string) ([]string, error) {
	if b.stateful && b.bug != losesState {
		b.mu.Lock()
		defer b.mu.Unlock()
		path := filepath.Join(dir, "rounds.json")
		raw, _ := json.Marshal(b.rounds)
		return []string{path}, os.WriteFile(path, raw, 0o600)
	}
	return nil, nil
}

func (b *broken) LoadState(ctx context.Context, dir string) error {
	if !b.stateful || b.bug == losesState {
		return nil
	}
	raw, err := os.ReadFile(filepath.Join(dir, "rounds.json"))
	if err != nil {
		return nil // no state saved: start fresh
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return json.Unmarshal(raw, &b.rounds)
}

func (b *broken) Shutdown(ctx context.Context) error {
	if b.bug == shutdownHangs {
		// Waits for the round in flight instead of ending it.
		b.inRound.Lock()
		b.inRound.Unlock()
	}
	err := b.Averager.Shutdown(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mapping != nil {
		b.mapping.Close()
		b.mapping = nil
	}
	return err
}

// TestBreakages: every broken averager fails the suite, with a message
// naming the promise it broke; the wrapper without a bug passes.
func TestBreakages(t *testing.T) {
	opts := []conformance.AveragerOption{gamma2, conformance.Stateful([]byte(`{"momentum": true}`))}
	for _, c := range []struct {
		bug    string
		phrase string
	}{
		{noBug, ""},
		{plainMean, "a round must leave the weighted mean Σ wᵢxᵢ / Σ wᵢ with wᵢ = stepsᵢ^gamma"},
		{ignoresGamma, "the ranks that trained in f32 buffers (gamma 2, steps [1 2 3])"},
		{weighsIdle, "a rank with steps 0 must weigh nothing"},
		{abortIgnored, "Abort must make the in-flight round return within 2s"},
		{shutdownHangs, "Shutdown must return within 2s even with a round in flight"},
		{losesState, "must equal the same round of an averager that kept going (state lost across Save/Load?)"},
		{falseSolo, "Configure claimed SoloIdentity, but a lone member's round changed the arena"},
	} {
		t.Run(c.bug, func(t *testing.T) {
			t.Parallel()
			failed, log := record(func(t conformance.T) {
				conformance.CheckAverager(t, func(conformance.T) (plugin.Averager, error) {
					return &broken{Averager: plugintest.NewAverager(nil), bug: c.bug}, nil
				}, opts...)
			})
			switch {
			case c.phrase == "" && failed:
				t.Fatalf("the averager without a bug failed the suite:\n%s", log)
			case c.phrase != "" && !failed:
				t.Fatalf("the suite passed an averager whose bug is %q", c.bug)
			case !strings.Contains(log.String(), c.phrase):
				t.Fatalf("the suite failed an averager whose bug is %q without saying %q:\n%s", c.bug, c.phrase, log)
			}
			t.Logf("failures:\n%s", log)
		})
	}
}

// brokenTrainer is the mock trainer with one promise broken.
type brokenTrainer struct {
	*plugintest.Trainer
	bug string

	mu       sync.Mutex
	mapping  *arena.Mapping
	training bool
	// resumed is the step count a LoadCheckpoint restored, until the next
	// Train: offByOne's schedule starts one step past it.
	resumed uint64
}

// The trainer bugs.
const (
	forgetsSteps   = "forgets steps trained since Publish"
	viewsArena     = "trains in the arena"
	busyWhileTrain = "refuses Publish while Train runs"
	ignoresPicks   = "trains the epoch's first picks whatever the offset"
	ignoresLRScale = "ignores LRScale"
	blendsWrongly  = "blends a·local + (1−a)·arena"
	offByOne       = "restores its schedule one step off"
	rollsBack      = "loads a replacement as a resume"
)

func (b *brokenTrainer) Train(ctx context.Context, p plugin.Plan, report func(plugin.BatchReport) error) error {
	b.mu.Lock()
	b.training = true
	if b.resumed != 0 && p.GlobalStep == 0 {
		p.GlobalStep = b.resumed + 1
	}
	b.resumed = 0
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.training = false
		b.mu.Unlock()
	}()
	switch b.bug {
	case ignoresPicks:
		p.PartitionOffset = 0
	case ignoresLRScale:
		p.LRScale = 0
	}
	return b.Trainer.Train(ctx, p, report)
}

func (b *brokenTrainer) LoadCheckpoint(ctx context.Context, dir string, reason plugin.LoadReason) (plugin.LoadResult, error) {
	if b.bug == rollsBack {
		reason = plugin.LoadResume
	}
	res, err := b.Trainer.LoadCheckpoint(ctx, dir, reason)
	if err == nil && b.bug == offByOne {
		b.mu.Lock()
		b.resumed = res.StepCount
		b.mu.Unlock()
	}
	return res, err
}

func (b *brokenTrainer) Publish(ctx context.Context) (plugin.PublishResult, error) {
	b.mu.Lock()
	busy := b.training && b.bug == busyWhileTrain
	b.mu.Unlock()
	if busy {
		return plugin.PublishResult{}, errors.New("broken trainer: Train is running")
	}
	return b.Trainer.Publish(ctx)
}

func (b *brokenTrainer) Attach(ctx context.Context, d arena.Descriptor) (bool, error) {
	zc, err := b.Trainer.Attach(ctx, d)
	if err != nil {
		return zc, err
	}
	m, err := arena.Open(d)
	if err != nil {
		return zc, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mapping != nil {
		b.mapping.Close()
	}
	b.mapping = m
	return zc || b.bug == viewsArena, nil
}

// Adopt, with forgetsSteps, publishes first (so no step is left to credit)
// and puts the arena back: an overwrite.
func (b *brokenTrainer) Adopt(ctx context.Context, alpha float64) (float64, error) {
	b.mu.Lock()
	m := b.mapping
	b.mu.Unlock()
	if b.bug == forgetsSteps && m != nil {
		saved := append([]byte(nil), m.Bytes()...)
		if _, err := b.Trainer.Publish(ctx); err != nil {
			return 0, err
		}
		copy(m.Bytes(), saved)
	}
	if b.bug == blendsWrongly && alpha > 0 && alpha < 1 {
		alpha = 1 - alpha
	}
	return b.Trainer.Adopt(ctx, alpha)
}

func (b *brokenTrainer) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	if b.mapping != nil {
		b.mapping.Close()
		b.mapping = nil
	}
	b.mu.Unlock()
	return b.Trainer.Shutdown(ctx)
}

// scheduledTrainer is the mock with a rate that follows its schedule's
// step and a momentum, so a restore that loses either shows in the next
// step.
var scheduledTrainer = conformance.TrainerSettings(plugintest.TrainerSettings{Samples: 256, EvalSamples: 64, Features: 8, BatchSize: 16, LR: 0.1,
	LRDecay: 0.05, Momentum: 0.5}.JSON())

// TestTrainerBreakages: a trainer that breaks a promise fails the suite,
// saying which promise; the wrapper without a bug passes, in every
// configuration the cases use.
func TestTrainerBreakages(t *testing.T) {
	for _, c := range []struct {
		bug      string
		settings conformance.TrainerOption
		phrase   string
	}{
		{noBug + " (copies)", smallTrainer, ""},
		{noBug + " (scheduled)", scheduledTrainer, ""},
		{noBug + " (in place)", inPlaceTrainer, ""},
		{forgetsSteps, smallTrainer, "Adopt after steps trained since Publish must credit them, current + (arena − published)"},
		{viewsArena, smallTrainer, "configured with OverlapRounds, must keep its parameters out of the arena"},
		{busyWhileTrain, smallTrainer, "Publish and Adopt must succeed while Train runs: Publish: broken trainer: Train is running"},
		{ignoresPicks, smallTrainer, "Train must train its plan's picks, plugin.Permutation(Seed, Epoch, PickSpace)[PartitionOffset:][:PartitionSize]: rank 0 of 2 trained sample"},
		{ignoresLRScale, smallTrainer, "Train must multiply its learning rate by the plan's LRScale: one batch with LRScale 0.25 moved the parameters by 1·(the move without it)"},
		{blendsWrongly, smallTrainer, "Adopt(0.25) must blend (1-a)·local + a·arena, local being the values at the last Publish"},
		{offByOne, scheduledTrainer, "a checkpoint and its restore must give the same next step, bit for bit"},
		{rollsBack, inPlaceTrainer, "LoadCheckpoint(LoadReplacement) must leave the arena as it is, since it holds parameters newer than the checkpoint's"},
	} {
		t.Run(c.bug, func(t *testing.T) {
			t.Parallel()
			failed, log := record(func(t conformance.T) {
				conformance.CheckTrainer(t, func(conformance.T) (plugin.Trainer, error) {
					return &brokenTrainer{Trainer: plugintest.NewTrainer(nil), bug: c.bug}, nil
				}, c.settings)
			})
			switch {
			case c.phrase == "" && failed:
				t.Fatalf("the trainer without a bug failed the suite:\n%s", log)
			case c.phrase == "":
				return
			case c.phrase != "" && !failed:
				t.Fatalf("the suite passed a trainer whose bug is %q", c.bug)
			case !strings.Contains(log.String(), c.phrase):
				t.Fatalf("the suite failed a trainer whose bug is %q without saying %q:\n%s", c.bug, c.phrase, log)
			}
			t.Logf("failures:\n%s", log)
		})
	}
}
