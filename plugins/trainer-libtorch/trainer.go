package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

const (
	pluginName    = "libtorch"
	pluginVersion = "0.1.0"
	// shimEnv names the shim to load instead of the default places.
	shimEnv = "COHORT_TORCH_SHIM"
	// shimFile is the shim's file name.
	shimFile = "libcohort_torch_shim.so"
	// paramNormEvery is how often (in steps) a batch report carries the
	// parameter norm.
	paramNormEvery = 10
	// maxPickSpace bounds a plan's permutation (8 bytes a pick).
	maxPickSpace = 1 << 28
)

// Trainer is the libtorch trainer: a model, its optimizer and the data in
// one process, driven through the shim. Its parameters live in the arena
// once attached (see the README); it is safe for concurrent use, with one
// Train at a time.
type Trainer struct {
	logger hclog.Logger
	shim   *shim
	// forceCopy makes Attach copy instead of viewing, as for CUDA models;
	// tests use it to exercise that path on the CPU.
	forceCopy bool
	// traceBatch, when set, sees every batch's sample indices (tests).
	traceBatch func(epoch uint64, samples []uint64)

	// trainMu is held by Train for its whole run.
	trainMu sync.Mutex
	// thread runs every Train's batch loop (see computeThread); Shutdown
	// stops it.
	thread *computeThread
	// picker is Train's (under trainMu): an epoch's plans share a shuffle.
	picker plugin.Picker

	mu      sync.Mutex
	cfg     plugin.TrainerConfig
	s       Settings
	threads int
	// prefetch says whether a goroutine gathers the next batch while one
	// trains: when the host has a core beyond the intra-op threads of its
	// ranks (see spareCore).
	prefetch  bool
	model     *model // nil before Configure and after Shutdown
	train     *dataset
	eval      *dataset
	layout    arena.Layout
	mapping   *arena.Mapping
	retired   []*arena.Mapping // mappings a failed Attach may still point into
	zeroCopy  bool
	steps     uint64 // optimizer steps in total
	lastPub   uint64 // steps at the last Publish
	schedStep uint64 // the learning-rate schedule's step
	// bufs are the two batches Train alternates between: one trains while
	// the other is gathered.
	bufs     [2]*batchBuf
	errBuf   []byte
	shutdown bool
	// gen counts Configure and Shutdown calls: a Train started on one
	// model stops when another replaces it.
	gen uint64
}

var _ plugin.Trainer = (*Trainer)(nil)

// newTrainer is the plugin factory: it loads the shim (and so libtorch)
// now, after plugin.Serve has moved fd 1 off the handshake stream.
func newTrainer(logger hclog.Logger) (plugin.Trainer, error) {
	return NewTrainer(logger)
}

// NewTrainer loads the shim and returns an unconfigured trainer.
func NewTrainer(logger hclog.Logger) (*Trainer, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s, err := loadShim()
	if err != nil {
		return nil, err
	}
	logger.Debug("loaded the libtorch shim", "path", s.path, "libtorch", s.TorchVersion, "cuda_devices", s.CUDADevices)
	return &Trainer{logger: logger, shim: s, errBuf: make([]byte, errBufLen), thread: newComputeThread()}, nil
}

// Describe names the plugin and its libtorch.
func (t *Trainer) Describe(context.Context) (plugin.Description, error) {
	caps := []string{"cpu", "torchscript", "zero-copy"}
	if t.shim.CUDADevices > 0 {
		caps = append(caps, "cuda")
	}
	return plugin.Description{
		Name:         pluginName,
		Version:      fmt.Sprintf("%s (libtorch %s, shim ABI %d)", pluginVersion, t.shim.TorchVersion, shimABI),
		Capabilities: caps,
	}, nil
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

// Configure parses the settings, loads the data, builds the model and its
// optimizer and returns the layout. A trainer configured before drops its
// model, arena and counters.
func (t *Trainer) Configure(_ context.Context, cfg plugin.TrainerConfig) (plugin.TrainerSetup, error) {
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: rank %d of a world of %d", cfg.Rank, cfg.WorldSize)
	}
	s, err := parseSettings(cfg.Settings)
	if err != nil {
		return plugin.TrainerSetup{}, err
	}
	if s.Model != "mlp" && s.Model != "cnn" {
		if _, err := os.Stat(s.Model); err != nil {
			return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: model = %q is not \"mlp\", \"cnn\" or a TorchScript file: %w", s.Model, err)
		}
	}
	start := time.Now()
	train, eval, err := loadData(&s)
	if err == nil {
		err = checkCompatible(train, eval)
	}
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: %w", err)
	}
	loadTime := time.Since(start)

	inShape, err := inputShape(&s, train)
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: %w", err)
	}
	outputs := s.Outputs
	if outputs == 0 {
		if s.Loss == "cross_entropy" {
			outputs = train.maxLabel + 1
			if eval != nil {
				outputs = max(outputs, eval.maxLabel+1)
			}
		} else {
			outputs = int64(train.width)
		}
	}
	threads := s.Threads
	if threads == 0 {
		threads = defaultThreads(cfg.LocalRanks)
	}
	spec := modelSpec{
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
	}
	m, err := t.shim.newModel(spec)
	if err != nil {
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: model %q: %w", s.Model, err)
	}
	layout, err := modelLayout(m)
	if err == nil {
		err = probe(m, &s, train, eval)
	}
	if err != nil {
		m.close()
		return plugin.TrainerSetup{}, fmt.Errorf("libtorch trainer: model %q: %w", s.Model, err)
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if t.shutdown {
		m.close()
		return plugin.TrainerSetup{}, errors.New("libtorch trainer: Configure after Shutdown")
	}
	t.releaseLocked()
	t.gen++
	t.cfg = cfg
	t.cfg.Settings = append([]byte(nil), cfg.Settings...)
	t.s, t.threads, t.model, t.train, t.eval, t.layout = s, threads, m, train, eval, layout
	t.prefetch = spareCore(threads, cfg.LocalRanks, runtime.NumCPU())
	t.steps, t.lastPub, t.schedStep = 0, 0, 0
	for i := range t.bufs {
		t.bufs[i] = newBatchBuf(train, int(s.BatchSize))
	}
	var evalN uint64
	if eval != nil {
		evalN = uint64(eval.n)
	}
	t.logger.Info("configured", "model", s.Model, "tensors", len(layout.Entries), "arena_bytes", layout.Size,
		"samples", train.n, "eval_samples", evalN, "threads", threads, "device", s.Device,
		"optimizer", s.Optimizer, "data_load", loadTime.Round(time.Millisecond).String())
	return plugin.TrainerSetup{Layout: layout, Samples: uint64(train.n), EvalSamples: evalN, BatchSize: s.BatchSize}, nil
}

// inputShape is the per-sample shape the model receives.
func inputShape(s *Settings, train *dataset) ([]int64, error) {
	if s.InputShape != nil {
		n := int64(1)
		for _, d := range s.InputShape {
			n *= d
		}
		if n != int64(train.features) {
			return nil, fmt.Errorf("input_shape = %v holds %d values, the data has %d per sample (%v)", s.InputShape, n, train.features, train.shape)
		}
		return s.InputShape, nil
	}
	switch {
	case s.Model != "cnn":
		return []int64{int64(train.features)}, nil
	case len(train.shape) == 2:
		return []int64{1, train.shape[0], train.shape[1]}, nil
	case len(train.shape) == 3:
		return train.shape, nil
	}
	return nil, fmt.Errorf("model \"cnn\" needs image samples ([height, width] or [channels, height, width]); the data's samples are %v (set input_shape)", train.shape)
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
func modelLayout(m *model) (arena.Layout, error) {
	infos, err := m.tensors()
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
func probe(m *model, s *Settings, train, eval *dataset) error {
	rows := min(2, train.n)
	idx := make([]uint64, rows)
	for i := range idx {
		idx[i] = uint64(i)
	}
	x := make([]float32, rows*train.features)
	train.gather(idx, x, make([]int64, rows), make([]float32, rows*max(train.width, 1)))
	shape, err := m.forward(x, rows, nil)
	if err != nil {
		return fmt.Errorf("a forward pass on %d samples of shape %v failed: %w", rows, train.shape, err)
	}
	if s.Loss == "cross_entropy" {
		maxLabel := train.maxLabel
		if eval != nil {
			maxLabel = max(maxLabel, eval.maxLabel)
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
	if len(shape) < 1 || shape[0] != int64(rows) || per != int64(train.width) {
		return fmt.Errorf("the model outputs %v for %d samples, but the targets have %d values per sample: its output does not fit the targets", shape, rows, train.width)
	}
	return nil
}

// releaseLocked drops the model, then the arena it may point into.
func (t *Trainer) releaseLocked() error {
	t.model.close()
	t.model = nil
	var errs []error
	if t.mapping != nil {
		errs = append(errs, t.mapping.Close())
		t.mapping = nil
	}
	for _, m := range t.retired {
		errs = append(errs, m.Close())
	}
	t.retired = nil
	t.zeroCopy = false
	return errors.Join(errs...)
}

// Attach maps the arena, copies the parameters into it and (on the CPU)
// makes every tensor a view of it.
func (t *Trainer) Attach(_ context.Context, d arena.Descriptor) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return false, errors.New("libtorch trainer: Attach before Configure")
	}
	if d.Layout.Digest() != t.layout.Digest() {
		return false, fmt.Errorf("libtorch trainer: arena %s has a different layout (%d tensors, %d bytes) than the model (%d tensors, %d bytes)",
			d.Path, len(d.Layout.Entries), d.Layout.Size, len(t.layout.Entries), t.layout.Size)
	}
	m, err := arena.Open(d)
	if err != nil {
		return false, fmt.Errorf("libtorch trainer: %w", err)
	}
	offsets := make([]uint64, len(d.Layout.Entries))
	for i, e := range d.Layout.Entries {
		offsets[i] = e.Offset
	}
	zc, err := t.model.attach(m.Bytes(), offsets, t.forceCopy)
	if err != nil {
		// Some tensors may already view the new block: keep both mapped
		// until the model is gone.
		t.retired = append(t.retired, m)
		return false, fmt.Errorf("libtorch trainer: arena %s: %w", d.Path, err)
	}
	if t.mapping != nil {
		if err := t.mapping.Close(); err != nil {
			t.logger.Warn("closing the previous arena", "error", err)
		}
	}
	t.mapping, t.zeroCopy = m, zc
	t.logger.Debug("attached", "arena", d.Path, "bytes", d.Layout.Size, "zero_copy", zc)
	return zc, nil
}

// Train runs the plan's picks (plugin.Picker; pick p trains sample
// p % samples) in batches of batch_size, the last one possibly short,
// reporting after every batch. ctx is checked between batches.
func (t *Trainer) Train(ctx context.Context, plan plugin.Plan, report func(plugin.BatchReport) error) error {
	if !t.trainMu.TryLock() {
		return errors.New("libtorch trainer: Train is already running")
	}
	defer t.trainMu.Unlock()
	// The whole batch loop runs on the trainer's own OS thread, the same
	// one for every Train of its lifetime: libtorch and OpenBLAS keep state
	// per thread, and a thread that changes at every call (each short Train
	// of a sync_every window) starts cold.
	var err error
	if rerr := t.thread.run(func() { err = t.trainOnThread(ctx, plan, report) }); rerr != nil {
		return errors.New("libtorch trainer: Train after Shutdown")
	}
	return err
}

// batchBuf is one gathered batch: features, and labels or targets.
type batchBuf struct {
	idx []uint64
	x   []float32
	y   []int64
	tg  []float32
	n   int
}

func newBatchBuf(d *dataset, batch int) *batchBuf {
	b := &batchBuf{idx: make([]uint64, batch), x: make([]float32, batch*d.features)}
	if d.labels != nil {
		b.y = make([]int64, batch)
	} else {
		b.tg = make([]float32, batch*d.width)
	}
	return b
}

// fill gathers the samples picks name (modulo the set's size) into b.
func (b *batchBuf) fill(d *dataset, picks []uint64) {
	n := len(picks)
	b.n = n
	for i, p := range picks {
		b.idx[i] = p % uint64(d.n)
	}
	y, tg := b.targets(d.width)
	d.gather(b.idx[:n], b.x[:n*d.features], y, tg)
}

// targets are the batch's labels or, for a regression set, its width-wide
// targets; the other is nil.
func (b *batchBuf) targets(width int) ([]int64, []float32) {
	if b.y != nil {
		return b.y[:b.n], nil
	}
	return nil, b.tg[:b.n*width]
}

// trainOnThread is Train's batch loop, on t.thread. With a core to spare
// (t.prefetch), a goroutine gathers the next batch while this one trains,
// as a data loader prefetches: the gather reads random rows of the
// training set, and its cache misses would otherwise sit on the training
// thread between every two steps.
func (t *Trainer) trainOnThread(ctx context.Context, plan plugin.Plan, report func(plugin.BatchReport) error) error {
	t.mu.Lock()
	if t.model == nil {
		t.mu.Unlock()
		return errors.New("libtorch trainer: Train before Configure")
	}
	data, bufs, batch, gen, prefetch := t.train, t.bufs, uint64(t.s.BatchSize), t.gen, t.prefetch
	if plan.GlobalStep != 0 {
		t.schedStep = plan.GlobalStep
	}
	t.mu.Unlock()

	if plan.PickSpace > maxPickSpace {
		return fmt.Errorf("libtorch trainer: pick space %d exceeds the limit of %d", plan.PickSpace, maxPickSpace)
	}
	picks, err := t.picker.Picks(plan)
	if err != nil {
		return fmt.Errorf("libtorch trainer: %w", err)
	}
	if len(picks) == 0 {
		return nil
	}

	// take cuts the next batch's picks.
	take := func() []uint64 {
		n := min(batch, uint64(len(picks)))
		p := picks[:n]
		picks = picks[n:]
		return p
	}
	// next hands the loop its next batch, and release returns one.
	next := func() (*batchBuf, bool) {
		if len(picks) == 0 {
			return nil, false
		}
		bufs[0].fill(data, take())
		return bufs[0], true
	}
	release := func(*batchBuf) {}
	if prefetch {
		free := make(chan *batchBuf, len(bufs))
		for _, b := range bufs {
			free <- b
		}
		ready := make(chan *batchBuf)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(ready)
			for len(picks) > 0 {
				var b *batchBuf
				select {
				case b = <-free:
				case <-stop:
					return
				}
				b.fill(data, take())
				select {
				case ready <- b:
				case <-stop:
					return
				}
			}
		}()
		defer func() {
			close(stop)
			wg.Wait()
		}()
		next = func() (*batchBuf, bool) {
			b, ok := <-ready
			return b, ok
		}
		release = func(b *batchBuf) { free <- b }
	}

	for n := uint64(0); ; n++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("libtorch trainer: stopped before batch %d: %w", n, err)
		}
		start := time.Now()
		b, ok := next()
		if !ok {
			return nil
		}
		if t.traceBatch != nil {
			t.traceBatch(plan.Epoch, b.idx[:b.n])
		}
		rep, err := t.step(gen, data, b, start)
		release(b)
		if err != nil {
			return fmt.Errorf("libtorch trainer: epoch %d batch %d: %w", plan.Epoch, n, err)
		}
		rep.Batch = n
		if err := report(rep); err != nil {
			return err
		}
	}
}

// step trains one gathered batch; start is when the training thread began
// waiting for it, so DataMS is the wait the gather still cost it.
func (t *Trainer) step(gen uint64, data *dataset, b *batchBuf, start time.Time) (plugin.BatchReport, error) {
	dataTime := time.Since(start)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.model == nil || t.gen != gen {
		return plugin.BatchReport{}, errors.New("the trainer was shut down or reconfigured while training")
	}
	n := b.n
	y, tg := b.targets(data.width)
	loss, err := t.model.trainStep(b.x[:n*data.features], n, y, tg, data.width, t.s.lrAt(t.schedStep), t.errBuf)
	if err != nil {
		return plugin.BatchReport{}, err
	}
	t.steps++
	t.schedStep++
	rep := plugin.BatchReport{Samples: uint32(n), Loss: loss, StepCount: t.steps}
	if t.steps%paramNormEvery == 0 {
		if norm, err := t.model.norm(); err == nil {
			rep.ParamNorm = &norm
		}
	}
	rep.DataMS = ms(dataTime)
	rep.BatchMS = ms(time.Since(start))
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Publish makes the arena hold the parameters: nothing to copy when they
// live there (zero-copy), a copy otherwise. In both cases the values are
// kept for a blending Adopt.
func (t *Trainer) Publish(context.Context) (plugin.PublishResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.attachedLocked("Publish"); err != nil {
		return plugin.PublishResult{}, err
	}
	norm, err := t.model.publish()
	if err != nil {
		return plugin.PublishResult{}, fmt.Errorf("libtorch trainer: %w", err)
	}
	res := plugin.PublishResult{Steps: t.steps - t.lastPub, StepCount: t.steps, ParamNorm: norm}
	t.lastPub = t.steps
	return res, nil
}

// Adopt makes the model use the arena's values (already the case for
// views); with blendAlpha in (0,1) every float tensor becomes
// (1-a)·published + a·arena. 0 and 1 overwrite.
func (t *Trainer) Adopt(_ context.Context, blendAlpha float64) (float64, error) {
	if !(blendAlpha >= 0 && blendAlpha <= 1) {
		return 0, fmt.Errorf("libtorch trainer: blend alpha %v is outside [0, 1]", blendAlpha)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.attachedLocked("Adopt"); err != nil {
		return 0, err
	}
	norm, err := t.model.adopt(blendAlpha)
	if err != nil {
		return 0, fmt.Errorf("libtorch trainer: %w", err)
	}
	return norm, nil
}

func (t *Trainer) attachedLocked(op string) error {
	switch {
	case t.model == nil:
		return fmt.Errorf("libtorch trainer: %s before Configure", op)
	case t.mapping == nil:
		return fmt.Errorf("libtorch trainer: %s before Attach", op)
	}
	return nil
}

// Evaluate reports the mean loss (and, for cross_entropy, the accuracy)
// over the whole test split, in eval mode without gradients.
func (t *Trainer) Evaluate(ctx context.Context) (plugin.EvalResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.model == nil {
		return plugin.EvalResult{}, errors.New("libtorch trainer: Evaluate before Configure")
	}
	d := t.eval
	if d == nil {
		return plugin.EvalResult{}, errNoEval
	}
	chunk := min(int(t.s.EvalBatchSize), d.n)
	x := make([]float32, chunk*d.features)
	var y []int64
	var tg []float32
	if d.labels != nil {
		y = make([]int64, chunk)
	} else {
		tg = make([]float32, chunk*d.width)
	}
	idx := make([]uint64, chunk)
	var lossSum float64
	var correct int64
	for lo := 0; lo < d.n; lo += chunk {
		if err := ctx.Err(); err != nil {
			return plugin.EvalResult{}, fmt.Errorf("libtorch trainer: evaluation stopped: %w", err)
		}
		n := min(chunk, d.n-lo)
		for i := range n {
			idx[i] = uint64(lo + i)
		}
		var yb []int64
		var tb []float32
		if y != nil {
			yb = y[:n]
		} else {
			tb = tg[:n*d.width]
		}
		d.gather(idx[:n], x[:n*d.features], yb, tb)
		l, c, err := t.model.evaluate(x[:n*d.features], n, yb, tb, d.width, t.errBuf)
		if err != nil {
			return plugin.EvalResult{}, fmt.Errorf("libtorch trainer: %w", err)
		}
		lossSum += l
		correct += c
	}
	res := plugin.EvalResult{Loss: lossSum / float64(d.n), Samples: uint64(d.n)}
	if d.labels != nil {
		acc := float64(correct) / float64(d.n)
		res.Accuracy = &acc
	}
	return res, nil
}

// Shutdown frees the model and unmaps the arena; the trainer cannot be
// used afterwards. It waits for a running batch, not for the whole Train.
func (t *Trainer) Shutdown(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shutdown = true
	t.gen++
	// A running Train stops at its next batch (gen changed) and the thread
	// exits after it.
	t.thread.stop()
	if err := t.releaseLocked(); err != nil {
		return fmt.Errorf("libtorch trainer: shutdown: %w", err)
	}
	return nil
}
