package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Plugins launches a rank's trainer and averager and stops them. A rank
// starts each at setup and again for each replacement, and calls StopAll
// once, at teardown; after StopAll returns no plugin it started may still
// run.
type Plugins interface {
	StartTrainer(ctx context.Context, name string) (plugin.Trainer, error)
	StartAverager(ctx context.Context, name string) (plugin.Averager, error)
	StopAll(ctx context.Context) error
}

// Replaceable is what Plugins offer when their plugins run as processes
// that can die or wedge on their own: the worker then replaces a lost
// plugin (Stop what is left of it, start a fresh one) instead of dying.
type Replaceable interface {
	// Exited reports whether the plugin of kind started last has ended.
	Exited(kind pluginhost.Kind) bool
	// Stop ends the plugin of kind started last: its Shutdown within ctx
	// and the grace period, then a kill. It is safe from any goroutine.
	Stop(ctx context.Context, kind pluginhost.Kind) error
}

// HostPlugins runs plugins as processes through core/pluginhost: the
// Shutdown RPC first, a kill after the grace period.
type HostPlugins struct {
	host *pluginhost.Host

	mu      sync.Mutex
	procs   []*pluginhost.Process
	current map[pluginhost.Kind]*pluginhost.Process
}

var (
	_ Plugins     = (*HostPlugins)(nil)
	_ Replaceable = (*HostPlugins)(nil)
)

// NewHostPlugins makes a HostPlugins over a pluginhost.Host with o.
func NewHostPlugins(o pluginhost.Options) *HostPlugins {
	return &HostPlugins{host: pluginhost.New(o)}
}

// StartTrainer launches cohort-trainer-<name>.
func (h *HostPlugins) StartTrainer(ctx context.Context, name string) (plugin.Trainer, error) {
	t, p, err := h.host.StartTrainer(ctx, name)
	if err != nil {
		return nil, err
	}
	h.track(p)
	return t, nil
}

// StartAverager launches cohort-averaging-<name>.
func (h *HostPlugins) StartAverager(ctx context.Context, name string) (plugin.Averager, error) {
	a, p, err := h.host.StartAverager(ctx, name)
	if err != nil {
		return nil, err
	}
	h.track(p)
	return a, nil
}

func (h *HostPlugins) track(p *pluginhost.Process) {
	h.mu.Lock()
	h.procs = append(h.procs, p)
	if h.current == nil {
		h.current = map[pluginhost.Kind]*pluginhost.Process{}
	}
	h.current[p.Kind] = p
	h.mu.Unlock()
}

func (h *HostPlugins) last(kind pluginhost.Kind) *pluginhost.Process {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.current[kind]
}

// Exited reports whether the plugin of kind started last has ended.
func (h *HostPlugins) Exited(kind pluginhost.Kind) bool {
	p := h.last(kind)
	return p != nil && p.Exited()
}

// Stop stops the plugin of kind started last.
func (h *HostPlugins) Stop(ctx context.Context, kind pluginhost.Kind) error {
	p := h.last(kind)
	if p == nil {
		return nil
	}
	return h.host.Stop(ctx, p)
}

// Processes lists the plugin processes started so far, in start order.
func (h *HostPlugins) Processes() []*pluginhost.Process {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*pluginhost.Process(nil), h.procs...)
}

// StopAll stops every plugin, last started first.
func (h *HostPlugins) StopAll(ctx context.Context) error {
	return h.host.StopAll(ctx)
}

// InProcess serves the given implementations from this process: for tests
// and for embedding cohort in a Go program. StopAll calls their Shutdown.
func InProcess(t plugin.Trainer, a plugin.Averager) Plugins {
	return &inProcess{trainer: t, averager: a}
}

type inProcess struct {
	trainer  plugin.Trainer
	averager plugin.Averager

	mu                 sync.Mutex
	startedT, startedA bool
}

func (p *inProcess) StartTrainer(ctx context.Context, _ string) (plugin.Trainer, error) {
	if err := p.start(ctx, p.trainer != nil, &p.startedT, "trainer"); err != nil {
		return nil, err
	}
	return p.trainer, nil
}

func (p *inProcess) StartAverager(ctx context.Context, _ string) (plugin.Averager, error) {
	if err := p.start(ctx, p.averager != nil, &p.startedA, "averager"); err != nil {
		return nil, err
	}
	return p.averager, nil
}

// start marks a plugin of kind started, when one was given.
func (p *inProcess) start(ctx context.Context, given bool, started *bool, kind string) error {
	if !given {
		return fmt.Errorf("in-process plugins: no %s given", kind)
	}
	p.mu.Lock()
	*started = true
	p.mu.Unlock()
	return ctx.Err()
}

// StopAll shuts down what was started, averager first (the reverse of the
// start order, as pluginhost does).
func (p *inProcess) StopAll(ctx context.Context) error {
	p.mu.Lock()
	startedT, startedA := p.startedT, p.startedA
	p.startedT, p.startedA = false, false
	p.mu.Unlock()
	var errs []error
	if startedA {
		if err := p.averager.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down in-process averager: %w", err))
		}
	}
	if startedT {
		if err := p.trainer.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down in-process trainer: %w", err))
		}
	}
	return errors.Join(errs...)
}
