// Package averager is the averaging-nccl plugin's Averager: it averages
// the arena's f32 parameters with the other ranks on their GPUs. Ranks
// that share a GPU are folded there by the lowest of them, its leader,
// which maps the others' device memory (CUDA IPC); the leaders of the
// session's GPUs sum their folds by an NCCL all-reduce and write the
// result back into their GPU's ranks. The ranks meet through the
// coordinator's relay alone: they post their GPU's name and their
// memory's handle, a session's lowest leader makes the NCCL unique id and
// posts it, and on shared GPUs each round's weights and barriers go
// through it too. CUDA,
// cuBLAS and NCCL are reached through internal/backend, so the state
// machine is tested on a fake.
//
// Where the trainer keeps its parameters on the GPU (a device block in the
// arena descriptor) the averager maps that block and averages it in
// place; otherwise each round copies the arena's f32 entries to the rank's
// device memory and back.
//
// The package by job: averager.go is the plugin's surface (Configure,
// NewSession, Abort, Shutdown); session.go lays a membership out over the
// GPUs and builds its communicator; posts.go holds what the ranks post
// through the relay (a GPU's place, a round's weighing) and the relay
// keys; round.go is a round's mean and broadcast; packing.go is the
// arena's f32 spans, copied into the staging buffer and back;
// smoothing.go is the outer optimizer.
package averager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/internal/cudalib"
	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Name is the plugin's name (binary cohort-averaging-nccl).
const Name = "nccl"

// Version is the plugin's version.
const Version = "0.1.0"

// ErrAborted is wrapped by the error of a round that Abort or Shutdown
// stopped, and of every Average after it until NewSession or Configure.
var ErrAborted = fmt.Errorf("%w by Abort", plugin.ErrRoundAborted)

// OpenFunc loads the backend; New's caller picks the real one or a fake.
type OpenFunc func(cudalib.Options) (backend.Backend, error)

// OpenNCCL is the OpenFunc of the real libraries.
func OpenNCCL(o cudalib.Options) (backend.Backend, error) { return backend.OpenNCCL(o) }

// Averager is the NCCL averager. Configure, Average, NewSession, Shutdown
// run one at a time; Abort and Describe may run concurrently with them.
type Averager struct {
	log  hclog.Logger
	open OpenFunc

	opMu    sync.Mutex
	cfg     config
	be      backend.Backend
	arena   *arena.Mapping
	relay   plugin.Relay
	rank    uint32
	device  int
	spans   []span
	np, nb  int // f32 elements of parameters and of buffers
	staging []byte
	// mem is the parameters on the device: the staging buffer's copy, or
	// the trainer's own block (onDevice), mapped; handle is what another
	// process opens it by.
	mem      backend.Memory
	onDevice bool
	handle   backend.IPCHandle
	gpuName  string         // the device's name across processes (backend.DeviceID)
	wmem     backend.Memory // a round's weighing sums on the device
	sess     session
	smooth   *smoother // nil: smoothing off

	// mu guards the abort state and the in-flight round's cancel.
	mu       sync.Mutex
	aborted  bool
	reason   string
	cancel   context.CancelFunc
	shutdown bool
}

// New returns an unconfigured averager loading its backend with open.
func New(log hclog.Logger, open OpenFunc) *Averager {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Averager{log: log, open: open}
}

var _ plugin.Averager = (*Averager)(nil)

// Describe names the plugin; its ranks meet through the relay.
func (a *Averager) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: Name, Version: Version, Capabilities: []string{"cuda", plugin.CapDeviceBlock},
		Meeting: plugin.MeetRelay, Settings: plugin.SchemaOf(Settings{})}, nil
}

// Configure loads NCCL and the CUDA runtime (failing at once, naming
// every place it looked, on a host without them), picks the GPU and maps
// the arena. The communicator is built at the first round, when every
// rank has come. A second Configure replaces the first.
func (a *Averager) Configure(ctx context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := a.teardown(); err != nil {
		a.log.Warn("releasing the previous configuration", "error", err)
	}
	if err := a.configure(cfg); err != nil {
		return plugin.AveragerTraits{}, errors.Join(err, a.teardown())
	}
	a.mu.Lock()
	a.aborted, a.reason, a.shutdown = false, "", false
	a.mu.Unlock()
	return plugin.AveragerTraits{SoloIdentity: true}, nil
}

func (a *Averager) configure(cfg plugin.AveragerConfig) error {
	c, err := parseSettings(cfg.Settings)
	if err != nil {
		return err
	}
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return fmt.Errorf("averager: rank %d of a world of %d", cfg.Rank, cfg.WorldSize)
	}
	if cfg.Relay == nil && cfg.WorldSize > 1 {
		return errors.New("averager: no relay to meet the other ranks through")
	}
	spans, np, nb, err := buildSpans(cfg.Arena.Layout)
	if err != nil {
		return err
	}
	be, err := a.open(c.libs)
	if err != nil {
		return fmt.Errorf("averaging-nccl: %w", err)
	}
	a.be = be
	n, err := be.DeviceCount()
	if err != nil {
		return fmt.Errorf("averaging-nccl: no usable GPU: %w", err)
	}
	dev := c.device
	if d := cfg.Arena.Device; d != nil {
		// The trainer's parameters are on a GPU: average them there.
		if err := cfg.Arena.Layout.CheckDevice(*d); err != nil {
			return fmt.Errorf("averager: %w", err)
		}
		on := -1
		for i := range n {
			if id, err := be.DeviceID(i); err == nil && id == d.GPU {
				on = i
				break
			}
		}
		switch {
		case on < 0:
			return fmt.Errorf("averaging-nccl: the trainer's parameters are on GPU %s, which is none of the %d this process sees", d.GPU, n)
		case dev >= 0 && dev != on:
			return fmt.Errorf("averaging-nccl: device = %d, but the trainer's parameters are on device %d", dev, on)
		}
		dev = on
	}
	if dev < 0 {
		dev = int(cfg.Rank) % n
	}
	if dev >= n {
		return fmt.Errorf("averaging-nccl: device = %d, but this process sees %d GPUs", dev, n)
	}
	m, err := arena.Open(cfg.Arena)
	if err != nil {
		return fmt.Errorf("averager: %w", err)
	}
	a.cfg, a.arena, a.relay, a.rank, a.device = c, m, cfg.Relay, cfg.Rank, dev
	a.spans, a.np, a.nb = spans, np, nb
	if a.gpuName, err = be.DeviceID(dev); err != nil {
		return fmt.Errorf("averaging-nccl: name device %d: %w", dev, err)
	}
	if len(a.gpuName) == 0 || len(a.gpuName) > maxGPUName {
		return fmt.Errorf("averaging-nccl: device %d's name %q is empty or longer than %d bytes", dev, a.gpuName, maxGPUName)
	}
	a.staging = nil
	if d := cfg.Arena.Device; d != nil {
		if a.mem, err = be.Open(dev, d.Handle, int(d.Size)); err != nil {
			return fmt.Errorf("averaging-nccl: map the trainer's parameters on device %d: %w", dev, err)
		}
		a.handle, a.onDevice = d.Handle, true
	} else {
		// Staging through the host: a host buffer the size of the f32
		// entries, and its copy on the device.
		a.staging = make([]byte, 4*(np+nb))
		if a.mem, err = be.Alloc(dev, max(len(a.staging), 4)); err != nil {
			return fmt.Errorf("averaging-nccl: device memory for %d bytes of parameters: %w", len(a.staging), err)
		}
		if a.handle, err = a.mem.Handle(); err != nil {
			return fmt.Errorf("averaging-nccl: %w", err)
		}
		a.onDevice = false
	}
	if a.wmem, err = be.Alloc(dev, 8*weighSums); err != nil {
		return fmt.Errorf("averaging-nccl: device memory for the weights: %w", err)
	}
	a.smooth = nil
	if c.smoothing > 0 {
		a.smooth = newSmoother(c.smoothing, np)
		if a.onDevice {
			if err := a.smooth.onDevice(be, dev); err != nil {
				return fmt.Errorf("averaging-nccl: smoothing state on device %d: %w", dev, err)
			}
		}
	}
	members := make([]uint32, cfg.WorldSize)
	for i := range members {
		members[i] = uint32(i)
	}
	a.sess = session{members: members, rank: int(cfg.Rank)}
	a.log.Info("configured", "device", dev, "devices", n, "elements", np+nb, "parameters_on_device", a.onDevice)
	return nil
}

// teardown aborts the communicator and releases the device memory, the
// arena and the libraries.
func (a *Averager) teardown() error {
	errs := []error{a.dropSession()}
	for _, m := range []*backend.Memory{&a.mem, &a.wmem} {
		if *m != nil {
			errs = append(errs, (*m).Close())
			*m = nil
		}
	}
	if a.smooth != nil {
		errs = append(errs, a.smooth.release())
	}
	if a.arena != nil {
		errs = append(errs, a.arena.Close())
		a.arena = nil
	}
	if a.be != nil {
		errs = append(errs, a.be.Close())
		a.be = nil
	}
	return errors.Join(errs...)
}

// NewSessionID returns a fresh unique id's bytes; it only names the
// session, since the communicator's own id goes through the relay.
func (a *Averager) NewSessionID(context.Context) ([]byte, error) {
	id := make([]byte, 16)
	_, err := rand.Read(id)
	return id, err
}

// NewSession adopts a new membership: a round still in flight is
// aborted, the old communicator with it, and the session's communicator
// is built among s.Members at its first round. A session of one has no
// communicator. The averager leaves the aborted state.
func (a *Averager) NewSession(_ context.Context, s plugin.Session) error {
	if len(s.Members) == 0 || int(s.NewRank) >= len(s.Members) || uint32(len(s.Members)) != s.NewWorldSize {
		return fmt.Errorf("averager: session %d: new rank %d, world %d and %d members do not agree", s.Generation, s.NewRank, s.NewWorldSize, len(s.Members))
	}
	a.abort(fmt.Sprintf("superseded by session %d", s.Generation))
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.arena != nil && s.Members[s.NewRank] != a.rank {
		return fmt.Errorf("averager: session %d names global rank %d as new rank %d, this averager is rank %d", s.Generation, s.Members[s.NewRank], s.NewRank, a.rank)
	}
	err := a.dropSession()
	a.sess = session{gen: s.Generation, members: append([]uint32(nil), s.Members...), rank: int(s.NewRank)}
	a.mu.Lock()
	if !a.shutdown {
		a.aborted, a.reason = false, ""
	}
	a.mu.Unlock()
	if err != nil {
		a.log.Warn("releasing the previous session", "generation", s.Generation, "error", err)
	}
	return nil
}

// Abort makes the in-flight round fail promptly (its collective's
// communicator is aborted) and keeps the averager aborted until
// NewSession or Configure. Idempotent; safe concurrently with Average.
func (a *Averager) Abort(_ context.Context, reason string) error {
	a.abort(reason)
	return nil
}

func (a *Averager) abort(reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.aborted {
		a.aborted, a.reason = true, reason
	}
	if a.cancel != nil {
		a.cancel()
	}
}

// Shutdown ends a round in flight, aborts the communicator and releases
// the arena and libraries. Idempotent.
func (a *Averager) Shutdown(context.Context) error {
	a.mu.Lock()
	a.shutdown = true
	a.mu.Unlock()
	a.abort("shut down")
	a.opMu.Lock()
	defer a.opMu.Unlock()
	return a.teardown()
}
