// Package trainer is the libtorch trainer plugin's plugin.Trainer: the
// settings (settings.go), Configure (configure.go: data, model, layout),
// the batch loop (train.go), the arena (arena.go: Attach, Publish, Adopt),
// Evaluate (evaluate.go) and checkpoints (checkpoint.go). The data comes
// from ../dataset; the model, its optimizer and every tensor op live in
// the C++ shim, reached through ../shim. The plugin README documents the
// settings and the arena contract.
package trainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/dataset"
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/hostshare"
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

const (
	pluginName    = "libtorch"
	pluginVersion = "0.1.0"
	// paramNormEvery is how often a batch report carries the parameter
	// norm: a monitoring figure (the host reads a round's norms from
	// Publish), and a pass over every parameter, 43 µs for the default MLP
	// at 2 threads, which every 10 steps cost 0.5% of its step time.
	paramNormEvery = time.Second
	// yieldWithin bounds the batch loop's time between two yields to the
	// Go scheduler, the next step included, as far as the last one
	// foretells it. Go's sysmon preempts a goroutine that ran 10 ms without
	// yielding (forcePreemptNS), a locked one's cgo calls included, and
	// then polls every 20 µs for about a millisecond, then less often, to
	// see it back: some 2,000 wake-ups a second beside a loop of short
	// steps, each taking a core from libtorch's threads where they fill
	// the machine. A yield costs one hand-off of the locked thread instead.
	yieldWithin = 8 * time.Millisecond
	// maxPickSpace bounds a plan's permutation (8 bytes a pick).
	maxPickSpace = 1 << 28
)

// Trainer is the libtorch trainer: a model, its optimizer and the data in
// one process, driven through the shim. Its parameters live in the arena
// once attached (see the README); it is safe for concurrent use, with one
// Train at a time.
type Trainer struct {
	logger hclog.Logger
	shim   *shim.Shim
	// forceCopy makes Attach copy instead of viewing, as for CUDA models;
	// tests use it to exercise that path on the CPU.
	forceCopy bool
	// traceBatch, when set, sees every batch's sample indices (tests).
	traceBatch func(epoch uint64, samples []uint64)
	// traceCall, when set, runs on t.calls before each call there (tests).
	traceCall func()

	// trainMu is held by Train for its whole run.
	trainMu sync.Mutex
	// thread runs every Train's batch loop (see shim.Thread); calls runs
	// every other call into libtorch (onCalls). Shutdown stops both. Two
	// threads, kept for the trainer's life, because libtorch starts
	// per-thread state on each new OS thread that calls it: an OpenMP
	// team, and a pthreadpool whose worker spins for some 25 ms on a core
	// training needs. gRPC serves each call on whatever thread the Go
	// scheduler picks, so every epoch's checkpoint and round used to pay
	// for a new one.
	thread *shim.Thread
	calls  *shim.Thread
	// picker is Train's (under trainMu): an epoch's plans share a shuffle.
	picker plugin.Picker

	mu sync.Mutex
	// waiting counts callers in lock: a run of steps in the shim reads it
	// before every step (sync/atomic only).
	waiting int32
	cfg     plugin.TrainerConfig
	s       Settings
	threads int
	// prefetch says whether a goroutine gathers the next batch while one
	// trains: when the host has a core beyond the intra-op threads of its
	// ranks (see spareCore).
	prefetch bool
	model    *shim.Model // nil before Configure and after Shutdown
	train    *dataset.Set
	eval     *dataset.Set
	// image is the host's shared copy of train and eval (nil for a copy
	// of their own); while held, this trainer may be the one that serves
	// it to the host's other ranks.
	image    *hostshare.Image
	layout   arena.Layout
	mapping  *arena.Mapping
	retired  []*arena.Mapping // mappings a failed Attach may still point into
	zeroCopy bool
	// published: Publish ran since the last Attach, so an Adopt can credit
	// the steps trained since.
	published bool
	steps     uint64    // optimizer steps in total
	runs      uint64    // runs of steps in the shim (trainRuns) started
	lastPub   uint64    // steps at the last Publish
	normAt    time.Time // when a batch report last carried the norm
	// hostCopy counts arena bytes copied between device and host since
	// the last Publish, for PublishResult.HostCopyBytes.
	hostCopy  uint64
	device    *deviceBlock // the parameters' GPU block, once exported
	schedStep uint64       // the learning-rate schedule's step
	// bufs are the two batches Train alternates between: one trains while
	// the other is gathered.
	bufs [2]*batchBuf
	// evalBuf is Evaluate's chunk of the test split, kept from Configure:
	// a fresh one per call is megabytes of garbage an epoch, which the Go
	// heap, sized by the data set it holds, keeps for many epochs.
	evalBuf  *batchBuf
	errBuf   []byte
	shutdown bool
	// gen counts Configure and Shutdown calls: a Train started on one
	// model stops when another replaces it.
	gen uint64
}

var _ plugin.Trainer = (*Trainer)(nil)

// Factory is the plugin factory: it loads the shim (and so libtorch) now,
// after plugin.Serve has moved fd 1 off the handshake stream.
func Factory(logger hclog.Logger) (plugin.Trainer, error) {
	return New(logger)
}

// New loads the shim and returns an unconfigured trainer.
func New(logger hclog.Logger) (*Trainer, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s, err := shim.Load()
	if err != nil {
		return nil, err
	}
	logger.Debug("loaded the libtorch shim", "path", s.Path, "libtorch", s.TorchVersion, "cuda_devices", s.CUDADevices)
	return &Trainer{logger: logger, shim: s, errBuf: make([]byte, shim.ErrBufLen), thread: shim.NewThread(), calls: shim.NewThread()}, nil
}

// onCalls runs f, a call into libtorch from outside the batch loop, on
// t.calls. f takes t.mu itself: Train's loop holds it for each step.
func onCalls[T any](t *Trainer, f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	if rerr := t.calls.Run(func() {
		if t.traceCall != nil {
			t.traceCall()
		}
		v, err = f()
	}); rerr != nil {
		return v, errAfterShutdown
	}
	return v, err
}

var errAfterShutdown = errors.New("libtorch trainer: called after Shutdown")

// Describe names the plugin and its libtorch.
func (t *Trainer) Describe(context.Context) (plugin.Description, error) {
	caps := []string{"cpu", "torchscript", "zero-copy", plugin.CapTrainsDuringRounds}
	if t.shim.CUDADevices > 0 {
		caps = append(caps, "cuda", plugin.CapDeviceBlock)
	}
	return plugin.Description{
		Name:         pluginName,
		Version:      fmt.Sprintf("%s (libtorch %s, shim ABI %d)", pluginVersion, t.shim.TorchVersion, shim.ABI),
		Capabilities: caps,
		Settings:     plugin.SchemaOf(Settings{}),
	}, nil
}

// releaseLocked drops the model, then the arena it may point into.
func (t *Trainer) releaseLocked() error {
	t.model.Close()
	t.model = nil
	errs := []error{t.releaseDevice()}
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

// Shutdown frees the model and unmaps the arena; the trainer cannot be
// used afterwards. It waits for a running batch, not for the whole Train.
func (t *Trainer) Shutdown(context.Context) error {
	t.lock()
	defer t.mu.Unlock()
	t.shutdown = true
	t.gen++
	// A running Train stops at its next batch (gen changed) and the thread
	// exits after it.
	t.thread.Stop()
	t.calls.Stop()
	if err := errors.Join(t.releaseLocked(), t.releaseImage()); err != nil {
		return fmt.Errorf("libtorch trainer: shutdown: %w", err)
	}
	return nil
}

// releaseImage stops serving the shared copy of the data, if this trainer
// does. Its mapping goes when the sets that read it do (hostshare.Mapping).
func (t *Trainer) releaseImage() error {
	if t.image == nil {
		return nil
	}
	err := t.image.Close()
	t.image = nil
	return err
}
