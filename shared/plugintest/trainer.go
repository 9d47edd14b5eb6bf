package plugintest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// TrainerName is the name the mock trainer describes itself with.
const TrainerName = "mock"

// Positions of the mock model's tensors in its layout.
const (
	entryWeight = iota
	entryBias
	entryFeatureMean
)

// featureMeanRate is the per-sample rate of the exponential running mean
// kept in the "feature_mean" buffer.
const featureMeanRate = 0.01

// paramNormEvery is how often (in steps) a batch report carries the norm.
const paramNormEvery = 10

// Trainer is the mock trainer: binary logistic regression (sigmoid, binary
// cross-entropy, SGD) on data generated from the configured seed, the same
// data on every rank.
//
// Its layout is "weight" [features] and "bias" [1] (parameters) and
// "feature_mean" [features] (a buffer: the exponential running mean of the
// features trained on, rate 0.01 per sample), all f32. By default the
// parameters live in Go slices, Publish copies them into the arena and
// Adopt copies them back; with the zero_copy setting they live in the
// arena and training writes it in place. The learning rate is lr, divided
// by 1 + lr_decay·t at the schedule's step t (a plan's GlobalStep sets it),
// times the plan's LRScale; every batch report carries it as the scalar
// "lr". With momentum the optimizer keeps a velocity per parameter, which
// checkpoints hold and the arena does not.
//
// A Trainer is safe for concurrent use; one Train runs at a time.
type Trainer struct {
	logger hclog.Logger

	// trainMu is held by Train for its whole run.
	trainMu sync.Mutex
	// picker is Train's (under trainMu): an epoch's plans share a shuffle.
	picker plugin.Picker

	mu       sync.Mutex
	cfg      plugin.TrainerConfig
	settings TrainerSettings
	sleep    time.Duration
	layout   arena.Layout
	data     *dataset // nil until Configure
	// The model's tensors: Go memory, or views of the arena when zeroCopy.
	weight []float32
	bias   []float32 // one value
	mean   []float32
	// vel is the momentum velocity of weight then bias.
	vel      []float32
	zeroCopy bool
	x        []float32 // one sample's features
	grad     []float64 // one batch's weight gradient
	steps    uint64    // optimizer steps in total
	lastPub  uint64    // steps at the last Publish
	sched    uint64    // the learning-rate schedule's step
	// pub holds weight, bias and mean as of the last Publish, for an Adopt
	// that blends or credits the steps trained since.
	pub     []float32
	trained uint64 // samples trained in total
	batches uint64 // batches trained by this process, for fail_after_batches
	adopts  uint64 // Adopts while Train ran in this process, for exit_on_adopt
	mapping *arena.Mapping
	ledger  *os.File
}

var _ plugin.Trainer = (*Trainer)(nil)

// NewTrainer makes an unconfigured mock trainer; logger may be nil.
func NewTrainer(logger hclog.Logger) *Trainer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Trainer{logger: logger}
}

// Describe names the mock.
func (t *Trainer) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: TrainerName, Version: "1", Capabilities: []string{"cpu", "deterministic", plugin.CapTrainsDuringRounds},
		Settings: plugin.SchemaOf(TrainerSettings{})}, nil
}

// CheckSettings lists every value of the block Configure would refuse.
func (t *Trainer) CheckSettings(_ context.Context, settings json.RawMessage) ([]plugin.SettingProblem, error) {
	_, _, problems, err := checkTrainerSettings(settings, 0)
	return problems, err
}

// Configure parses the settings, generates the data set's true weights from
// cfg.Seed and resets the model to zero. A trainer configured before drops
// its arena and its state.
func (t *Trainer) Configure(_ context.Context, cfg plugin.TrainerConfig) (plugin.TrainerSetup, error) {
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return plugin.TrainerSetup{}, fmt.Errorf("mock trainer: rank %d of a world of %d", cfg.Rank, cfg.WorldSize)
	}
	s, sleep, err := parseTrainerSettings(cfg.Settings, cfg.Rank)
	if err != nil {
		return plugin.TrainerSetup{}, err
	}
	layout, err := arena.Pack([]arena.Entry{
		{Name: "weight", DType: arena.F32, Shape: []int64{int64(s.Features)}, Role: arena.Parameter},
		{Name: "bias", DType: arena.F32, Shape: []int64{1}, Role: arena.Parameter},
		{Name: "feature_mean", DType: arena.F32, Shape: []int64{int64(s.Features)}, Role: arena.Buffer},
	})
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("mock trainer: layout: %w", err)
	}
	var ledger *os.File
	if s.Ledger != "" {
		ledger, err = os.OpenFile(s.Ledger, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return plugin.TrainerSetup{}, fmt.Errorf("mock trainer: ledger: %w", err)
		}
	}
	if s.NoiseStdout {
		printNoise("mock trainer Configure")
	}
	data := newDataset(cfg.Seed, s.Features)

	t.mu.Lock()
	defer t.mu.Unlock()
	t.releaseLocked()
	t.cfg = cfg
	t.cfg.Settings = append([]byte(nil), cfg.Settings...)
	t.settings, t.sleep, t.layout, t.data = s, sleep, layout, data
	t.weight = make([]float32, s.Features)
	t.bias = make([]float32, 1)
	t.mean = make([]float32, s.Features)
	t.vel = make([]float32, s.Features+1)
	t.x = make([]float32, s.Features)
	t.grad = make([]float64, s.Features)
	t.steps, t.lastPub, t.sched, t.trained, t.batches = 0, 0, 0, 0, 0
	t.ledger = ledger
	t.logger.Debug("configured", "rank", cfg.Rank, "world", cfg.WorldSize, "features", s.Features, "samples", s.Samples)
	return plugin.TrainerSetup{Layout: layout, Samples: s.Samples, EvalSamples: s.EvalSamples, BatchSize: s.BatchSize,
		AdaptiveOptimizer: s.Adaptive}, nil
}

// Train runs the plan's slice of the epoch's permutation in batches of
// batch_size (the last may be short), reporting after every batch (report
// may be nil). ctx is checked between batches.
func (t *Trainer) Train(ctx context.Context, plan plugin.Plan, report func(plugin.BatchReport) error) error {
	if !t.trainMu.TryLock() {
		return errors.New("mock trainer: Train is already running")
	}
	defer t.trainMu.Unlock()

	t.mu.Lock()
	configured := t.data != nil
	samples, batchSize, sleep := t.settings.Samples, uint64(t.settings.BatchSize), t.sleep
	if plan.GlobalStep != 0 {
		t.sched = plan.GlobalStep
	}
	t.mu.Unlock()
	if !configured {
		return errors.New("mock trainer: Train before Configure")
	}
	if plan.PickSpace > MaxPickSpace {
		return fmt.Errorf("mock trainer: pick space %d exceeds the mock's limit of %d", plan.PickSpace, MaxPickSpace)
	}
	lrScale, err := plan.LRMultiplier()
	if err != nil {
		return fmt.Errorf("mock trainer: %w", err)
	}
	picks, err := t.picker.Picks(plan)
	if err != nil {
		return fmt.Errorf("mock trainer: %w", err)
	}
	if len(picks) == 0 {
		return nil
	}
	idx := make([]uint64, 0, min(batchSize, plan.PartitionSize))
	var line []byte
	for b := uint64(0); len(picks) > 0; b++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("mock trainer: stopped before batch %d: %w", b, err)
		}
		n := min(batchSize, uint64(len(picks)))
		idx = idx[:0]
		for _, p := range picks[:n] {
			idx = append(idx, p%samples)
		}
		picks = picks[n:]
		start := time.Now()
		rep, err := t.step(idx, lrScale)
		if err != nil {
			return err
		}
		rep.Batch = b
		// The step is in the model, so the ledger has it at once, stopped
		// or not: a real trainer's finished step is in its parameters
		// whether or not its report goes out.
		if line, err = t.writeLedger(line, plan.Epoch, idx); err != nil {
			return err
		}
		if sleep > 0 {
			if err := sleepCtx(ctx, sleep-time.Since(start)); err != nil {
				return fmt.Errorf("mock trainer: stopped in batch %d, trained but not reported: %w", b, err)
			}
		}
		rep.BatchMS = plugin.Milliseconds(time.Since(start))
		if report == nil {
			continue
		}
		if err := report(rep); err != nil {
			return err
		}
	}
	return nil
}

// step trains one batch of sample indices with one SGD step at the
// schedule's learning rate times lrScale.
func (t *Trainer) step(idx []uint64, lrScale float64) (plugin.BatchReport, error) {
	// While Train runs only a round's Publish or Adopt takes the lock.
	locking := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	held := time.Since(locking)
	if t.data == nil {
		return plugin.BatchReport{}, errors.New("mock trainer: shut down while training")
	}
	if f := t.settings.FailAfterBatches; f != 0 && t.batches >= f {
		return plugin.BatchReport{}, fmt.Errorf("mock trainer: failing as told after %d batches (fail_after_batches)", f)
	}
	clear(t.grad)
	var gradBias, loss float64
	var data time.Duration
	for _, i := range idx {
		t0 := time.Now()
		y := t.data.sample(splitTrain, i, t.x)
		data += time.Since(t0)
		z := float64(t.bias[0])
		for j, v := range t.x {
			z += float64(t.weight[j]) * float64(v)
		}
		loss += bce(z, y)
		e := sigmoid(z) - y
		gradBias += e
		for j, v := range t.x {
			t.grad[j] += e * float64(v)
			t.mean[j] += featureMeanRate * (v - t.mean[j])
		}
	}
	lr := t.settings.LR / (1 + t.settings.LRDecay*float64(t.sched)) * lrScale
	n := float64(len(idx))
	update := func(p *float32, v *float32, g float64) {
		if mu := t.settings.Momentum; mu > 0 {
			*v = float32(mu*float64(*v) + g/n)
			*p = float32(float64(*p) - lr*float64(*v))
			return
		}
		*p = float32(float64(*p) - lr/n*g)
	}
	for j, g := range t.grad {
		update(&t.weight[j], &t.vel[j], g)
	}
	update(&t.bias[0], &t.vel[len(t.weight)], gradBias)
	t.steps++
	t.sched++
	t.batches++
	t.trained += uint64(len(idx))
	rep := plugin.BatchReport{
		Samples:     uint32(len(idx)),
		Loss:        loss / n,
		DataMS:      plugin.Milliseconds(data),
		StepCount:   t.steps,
		Scalars:     map[string]float64{"lr": lr},
		RoundWaitMS: plugin.Milliseconds(held),
	}
	if t.steps%paramNormEvery == 0 {
		n := t.normLocked()
		rep.ParamNorm = &n
	}
	return rep, nil
}

// writeLedger appends the batch's "rank epoch index" lines in one write.
func (t *Trainer) writeLedger(buf []byte, epoch uint64, idx []uint64) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ledger == nil {
		return buf, nil
	}
	buf = buf[:0]
	for _, i := range idx {
		buf = strconv.AppendUint(buf, uint64(t.cfg.Rank), 10)
		buf = append(buf, ' ')
		buf = strconv.AppendUint(buf, epoch, 10)
		buf = append(buf, ' ')
		buf = strconv.AppendUint(buf, i, 10)
		buf = append(buf, '\n')
	}
	if _, err := t.ledger.Write(buf); err != nil {
		return buf, fmt.Errorf("mock trainer: ledger: %w", err)
	}
	return buf, nil
}

// Evaluate reports the mean loss and the accuracy on the eval split.
func (t *Trainer) Evaluate(context.Context) (plugin.EvalResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.data == nil {
		return plugin.EvalResult{}, errors.New("mock trainer: Evaluate before Configure")
	}
	var loss float64
	var correct uint64
	n := t.settings.EvalSamples
	for i := uint64(0); i < n; i++ {
		y := t.data.sample(splitEval, i, t.x)
		z := float64(t.bias[0])
		for j, v := range t.x {
			z += float64(t.weight[j]) * float64(v)
		}
		loss += bce(z, y)
		if (z >= 0) == (y == 1) {
			correct++
		}
	}
	acc := float64(correct) / float64(n)
	return plugin.EvalResult{Loss: loss / float64(n), Accuracy: &acc, Samples: n}, nil
}

// Shutdown releases the arena and the ledger; the trainer must be
// configured again before further use.
func (t *Trainer) Shutdown(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.data = nil
	return t.releaseLocked()
}

// Snapshot copies the model's parameters and counters: steps is the
// optimizer step count, trained the samples trained in total.
func (t *Trainer) Snapshot() (weight, bias []float32, steps, trained uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.weight), slices.Clone(t.bias), t.steps, t.trained
}

// FeatureMean copies the model's buffer.
func (t *Trainer) FeatureMean() []float32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.mean)
}

// sleepCtx waits d (nothing when d <= 0) or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// EpochEnd is the mock's end-of-epoch code: with epoch_end_file set it
// appends "rank epoch" to the file; without, it has none.
func (t *Trainer) EpochEnd(_ context.Context, epoch uint64) (bool, error) {
	t.mu.Lock()
	path, rank := t.settings.EpochEndFile, t.cfg.Rank
	t.mu.Unlock()
	if path == "" {
		return false, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return false, fmt.Errorf("mock trainer: epoch end: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d %d\n", rank, epoch)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("mock trainer: epoch end: %w", err)
	}
	return true, nil
}

var _ plugin.EpochEnder = (*Trainer)(nil)
