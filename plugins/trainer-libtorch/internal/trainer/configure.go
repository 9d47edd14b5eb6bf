package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/dataset"
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// checkedSettings are the block's settings, checked as far as they can
// be without loading data or building the model: every value, and that
// the model is one the trainer builds or a file it can read.
func checkedSettings(raw json.RawMessage) (Settings, error) {
	s, err := parseSettings(raw)
	if err != nil {
		return Settings{}, err
	}
	if err := checkModel(s.Model); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// checkModel refuses a model the trainer neither builds nor can read.
func checkModel(model string) error {
	if model == "" || model == "mlp" || model == "cnn" {
		return nil
	}
	if _, err := os.Stat(model); err != nil {
		return fmt.Errorf("libtorch trainer settings: model = %q is not \"mlp\", \"cnn\" or a TorchScript file: %w", model, err)
	}
	return nil
}

// CheckSettings checks the block as Configure would, loading and building
// nothing. parseSettings stops at its first refusal, so each refused key is
// taken out of the block and the rest checked again, until the block passes
// or a refusal names no key: every mistake is reported in one pass.
func (t *Trainer) CheckSettings(_ context.Context, settings json.RawMessage) ([]plugin.SettingProblem, error) {
	schema := plugin.SchemaOf(Settings{})
	var problems []plugin.SettingProblem
	var s Settings
	if err := plugin.DecodeSettings(settings, &s); err == nil {
		if err := checkModel(s.Model); err != nil {
			problems = append(problems, plugin.ProblemOf(err, schema))
		}
	}
	var block map[string]json.RawMessage
	if json.Unmarshal(settings, &block) != nil {
		block = nil
	}
	reported := map[string]bool{}
	for _, p := range problems {
		reported[p.Key] = true
	}
	for range len(schema) + 1 {
		_, err := parseSettings(settings)
		if err == nil {
			break
		}
		p := plugin.ProblemOf(err, schema)
		if !reported[p.Key] || p.Key == "" {
			problems = append(problems, p)
		}
		if _, ok := block[p.Key]; !ok || p.Key == "" {
			break
		}
		reported[p.Key] = true
		delete(block, p.Key)
		if settings, err = json.Marshal(block); err != nil {
			break
		}
	}
	return problems, nil
}

// Configure parses the settings, loads the data, builds the model and its
// optimizer and returns the layout. A trainer configured before drops its
// model, arena and counters.
func (t *Trainer) Configure(ctx context.Context, cfg plugin.TrainerConfig) (plugin.TrainerSetup, error) {
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: rank %d of a world of %d", cfg.Rank, cfg.WorldSize)
	}
	s, err := checkedSettings(cfg.Settings)
	if err != nil {
		return plugin.TrainerSetup{}, err
	}
	start := time.Now()
	train, eval, img, err := t.loadData(ctx, dataset.Source{
		Dir: s.Data, TrainX: s.DataX, TrainY: s.DataY, EvalX: s.EvalX, EvalY: s.EvalY,
		Loss: s.Loss, WidenMB: *s.WidenMB,
	})
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: %w", err)
	}
	loadTime := time.Since(start)
	configured := false
	defer func() {
		if !configured && img != nil {
			img.Close()
		}
	}()

	inShape, err := inputShape(&s, train)
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: %w", err)
	}
	outputs := s.Outputs
	if outputs == 0 {
		if s.Loss == "cross_entropy" {
			outputs = train.MaxLabel() + 1
			if eval != nil {
				outputs = max(outputs, eval.MaxLabel()+1)
			}
		} else {
			outputs = int64(train.Width())
		}
	}
	threads := s.Threads
	if threads == 0 {
		threads = defaultThreads(cfg.LocalRanks)
	}
	spec := shim.ModelSpec{
		Model:       s.Model,
		Hidden:      s.Hidden,
		InputShape:  inShape,
		Outputs:     outputs,
		Loss:        lossCode(s.Loss),
		Optimizer:   optimizerCode(s.Optimizer),
		LR:          *s.LR,
		WeightDecay: *s.WeightDecay,
		MaxGradNorm: s.MaxGradNorm,
		Seed:        cfg.Seed,
		Threads:     int32(threads),
		Device:      s.Device,
		Rank:        cfg.Rank,
	}
	if s.Optimizer == "sgd" {
		spec.Momentum, spec.Nesterov = *s.Momentum, *s.Nesterov
	} else {
		spec.Beta1, spec.Beta2, spec.Eps = s.Betas[0], s.Betas[1], *s.Eps
		spec.AverageMoments = *s.AverageMoments
		if *s.CohortSecondMoment {
			spec.CohortRanks = cfg.WorldSize
		}
	}
	type built struct {
		m      *shim.Model
		layout arena.Layout
	}
	bm, err := onCalls(t, func() (built, error) {
		m, err := t.shim.NewModel(spec)
		if err != nil {
			return built{}, err
		}
		layout, err := modelLayout(m)
		if err == nil {
			err = probe(m, &s, train, eval)
		}
		if err != nil {
			m.Close()
			return built{}, err
		}
		return built{m, layout}, nil
	})
	if errors.Is(err, errAfterShutdown) {
		return plugin.TrainerSetup{}, errors.New("libtorch trainer: Configure after Shutdown")
	}
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: model %q: %w", s.Model, err)
	}
	m, layout := bm.m, bm.layout

	// Runs after the unlock below: a Train of the model this one replaces
	// may hold the batch loop's thread until its next batch.
	var warm func()
	defer func() {
		if warm != nil {
			warm()
		}
	}()
	t.lock()
	defer t.mu.Unlock()
	if t.shutdown {
		m.Close()
		return plugin.TrainerSetup{}, errors.New("libtorch trainer: Configure after Shutdown")
	}
	t.releaseLocked()
	t.releaseImage()
	t.image, configured = img, true
	t.gen++
	gen := t.gen
	warm = func() { t.warmTrainThread(gen) }
	t.cfg = cfg
	t.cfg.Settings = append([]byte(nil), cfg.Settings...)
	t.s, t.threads, t.model, t.train, t.eval, t.layout = s, threads, m, train, eval, layout
	t.prefetch = spareCore(threads, cfg.LocalRanks, runtime.NumCPU())
	t.steps, t.lastPub, t.schedStep = 0, 0, 0
	for i := range t.bufs {
		t.bufs[i] = newBatchBuf(train, int(s.BatchSize))
	}
	var evalN uint64
	t.evalBuf = nil
	if eval != nil {
		evalN = uint64(eval.N())
		t.evalBuf = newBatchBuf(eval, min(int(s.EvalBatchSize), eval.N()))
	}
	t.logger.Info("configured", "model", s.Model, "tensors", len(layout.Entries), "arena_bytes", layout.Size,
		"samples", train.N(), "eval_samples", evalN, "threads", threads, "device", s.Device,
		"optimizer", s.Optimizer, "data_load", loadTime.Round(time.Millisecond).String())
	return plugin.TrainerSetup{Layout: layout, Samples: uint64(train.N()), EvalSamples: evalN, BatchSize: s.BatchSize,
		AdaptiveOptimizer: s.Optimizer == "adam" || s.Optimizer == "adamw"}, nil
}

// defaultThreads is cores / local ranks, at least 1.
func defaultThreads(localRanks uint32) int {
	return max(1, runtime.NumCPU()/int(max(localRanks, 1)))
}

// spareCore says whether local ranks of threads intra-op threads each
// leave a core of cores free. Only then does a gathering goroutine run
// beside the training: on a 2-core host, epochs alternating between the two
// ways in one lone-rank run came out 3-4% faster with it at 1 thread and
// 1-4% slower at 2, where the gather takes its time from libtorch's own
// threads and wakes one more thread a batch.
func spareCore(threads int, localRanks uint32, cores int) bool {
	return threads*int(max(localRanks, 1)) < cores
}

// inputShape is the per-sample shape the model receives.
func inputShape(s *Settings, train *dataset.Set) ([]int64, error) {
	if s.InputShape != nil {
		n := int64(1)
		for _, d := range s.InputShape {
			n *= d
		}
		if n != int64(train.Features()) {
			return nil, fmt.Errorf("input_shape = %v holds %d values, the data has %d per sample (%v)", s.InputShape, n, train.Features(), train.Shape())
		}
		return s.InputShape, nil
	}
	switch {
	case s.Model != "cnn":
		return []int64{int64(train.Features())}, nil
	case len(train.Shape()) == 2:
		return []int64{1, train.Shape()[0], train.Shape()[1]}, nil
	case len(train.Shape()) == 3:
		return train.Shape(), nil
	}
	return nil, fmt.Errorf("model \"cnn\" needs image samples ([height, width] or [channels, height, width]); the data's samples are %v (set input_shape)", train.Shape())
}

func lossCode(l string) int32 {
	if l == "mse" {
		return 2 // CT_LOSS_MSE
	}
	return 1 // CT_LOSS_CROSS_ENTROPY
}

func optimizerCode(o string) int32 {
	switch o {
	case "adam":
		return 2
	case "adamw":
		return 3
	}
	return 1
}

// modelLayout packs the model's tensors, in the shim's order.
func modelLayout(m *shim.Model) (arena.Layout, error) {
	infos, err := m.Tensors()
	if err != nil {
		return arena.Layout{}, err
	}
	entries := make([]arena.Entry, len(infos))
	for i, in := range infos {
		entries[i] = arena.Entry{Name: in.Name, DType: in.DType, Shape: in.Shape, Role: in.Role}
	}
	l, err := arena.Pack(entries)
	if err != nil {
		return arena.Layout{}, fmt.Errorf("layout: %w", err)
	}
	for i, in := range infos {
		if l.Entries[i].Bytes != in.Bytes {
			return arena.Layout{}, fmt.Errorf("layout: tensor %q: the shim reports %d bytes, the arena %d", in.Name, in.Bytes, l.Entries[i].Bytes)
		}
	}
	return l, nil
}

// probe runs the model on two samples and checks that its output fits the
// labels (cross_entropy: [batch, classes] with every label a class) or the
// targets (mse: as many values per sample).
func probe(m *shim.Model, s *Settings, train, eval *dataset.Set) error {
	rows := min(2, train.N())
	idx := make([]uint64, rows)
	for i := range idx {
		idx[i] = uint64(i)
	}
	x := make([]float32, rows*train.Features())
	train.Gather(idx, x, make([]int64, rows), make([]float32, rows*max(train.Width(), 1)))
	shape, err := m.Forward(x, rows, nil)
	if err != nil {
		return fmt.Errorf("a forward pass on %d samples of shape %v failed: %w", rows, train.Shape(), err)
	}
	if s.Loss == "cross_entropy" {
		maxLabel := train.MaxLabel()
		if eval != nil {
			maxLabel = max(maxLabel, eval.MaxLabel())
		}
		if len(shape) != 2 || shape[0] != int64(rows) {
			return fmt.Errorf("the model outputs %v for %d samples; cross_entropy needs [samples, classes]", shape, rows)
		}
		if shape[1] <= maxLabel {
			return fmt.Errorf("the model outputs %d classes per sample, but the labels go up to %d: its output does not fit the labels", shape[1], maxLabel)
		}
		return nil
	}
	per := int64(1)
	for _, d := range shape[1:] {
		per *= d
	}
	if len(shape) < 1 || shape[0] != int64(rows) || per != int64(train.Width()) {
		return fmt.Errorf("the model outputs %v for %d samples, but the targets have %d values per sample: its output does not fit the targets", shape, rows, train.Width())
	}
	return nil
}

// warmTrainThread starts libtorch's per-thread state on the batch loop's
// thread (its pthreadpool, whose new worker spins for some 25 ms, and its
// OpenMP team) with a pass over the parameters, so that they start while
// the run starts and not in its first batches. Started there, the spinning
// worker and the new team shared a core with the training thread for the
// first second of a lone rank's first epoch (5,000 preemptions of it).
func (t *Trainer) warmTrainThread(gen uint64) {
	t.thread.Run(func() {
		t.lock()
		defer t.mu.Unlock()
		if t.model != nil && t.gen == gen {
			t.model.Norm()
		}
	})
}
