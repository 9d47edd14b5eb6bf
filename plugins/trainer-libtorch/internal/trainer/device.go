package trainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/cohortdl/cohort/internal/cudalib"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The parameters on the GPU: with a model on CUDA and an averager that
// takes device blocks, ExportDevice moves the model's f32 tensors into one
// device allocation (cudaMalloc, not libtorch's caching allocator, so its
// CUDA IPC handle names exactly it) and makes them views of it; the
// averager maps it by that handle. The block lives until the model does.

var _ plugin.DeviceExporter = (*Trainer)(nil)

// deviceBlock is the allocation ExportDevice made and the runtime that
// made it.
type deviceBlock struct {
	rt  *cudalib.Runtime
	dev int
	p   cudalib.DevicePtr
}

// ExportDevice moves the f32 parameters and buffers into a device block
// on the model's GPU and describes it; a model on the CPU, or one that
// keeps its parameters apart for rounds beside training, stays on the
// arena.
func (t *Trainer) ExportDevice(context.Context) (arena.DeviceBlock, bool, error) {
	type exported struct {
		block arena.DeviceBlock
		ok    bool
	}
	r, err := onCalls(t, func() (exported, error) {
		b, ok, err := t.exportDevice()
		return exported{b, ok}, err
	})
	return r.block, r.ok, err
}

func (t *Trainer) exportDevice() (arena.DeviceBlock, bool, error) {
	t.lock()
	defer t.mu.Unlock()
	if err := t.attachedLocked("ExportDevice"); err != nil {
		return arena.DeviceBlock{}, false, err
	}
	if t.device != nil {
		return arena.DeviceBlock{}, false, errors.New("libtorch trainer: ExportDevice twice")
	}
	dev := t.model.DeviceIndex()
	if dev < 0 || t.cfg.OverlapRounds {
		return arena.DeviceBlock{}, false, nil
	}
	fail := func(err error) (arena.DeviceBlock, bool, error) {
		return arena.DeviceBlock{}, false, fmt.Errorf("libtorch trainer: the parameters' block on cuda:%d: %w", dev, err)
	}
	rt, err := cudalib.OpenRuntime(cudalib.Options{})
	if err != nil {
		return fail(err)
	}
	size := t.layout.DeviceBytes()
	var p cudalib.DevicePtr
	var h cudalib.IPCHandle
	err = rt.OnDevice(dev, func() error {
		var err error
		if p, err = rt.Malloc(int(max(size, 4))); err != nil {
			return err
		}
		h, err = rt.IPCHandleOf(p)
		return err
	})
	var name string
	if err == nil {
		name, err = rt.GPUName(dev)
	}
	if err != nil {
		if p != (cudalib.DevicePtr{}) {
			err = errors.Join(err, rt.OnDevice(dev, func() error { return rt.Free(p) }))
		}
		return fail(errors.Join(err, rt.Close()))
	}
	// From here the model may view the block: it is freed after the
	// model, however AttachDevice ends.
	t.device = &deviceBlock{rt: rt, dev: dev, p: p}
	if err := t.model.AttachDevice(p.Pointer(), size, deviceOffsets(t.layout)); err != nil {
		return fail(err)
	}
	t.logger.Info("parameters moved to a device block", "device", dev, "gpu", name, "bytes", size)
	return arena.DeviceBlock{GPU: name, Handle: h, Size: size}, true, nil
}

// deviceOffsets places each entry in the device block: the f32 parameters,
// then the f32 buffers, each in layout order (arena.DeviceBlock); -1 for
// the others, which stay on the arena.
func deviceOffsets(l arena.Layout) []int64 {
	out := make([]int64, len(l.Entries))
	var off int64
	for pass, role := range []arena.Role{arena.Parameter, arena.Buffer} {
		for i, e := range l.Entries {
			if pass == 0 {
				out[i] = -1
			}
			if e.Role == role && e.DType == arena.F32 {
				out[i] = off
				off += int64(e.Bytes)
			}
		}
	}
	return out
}

// releaseDevice frees the block, after the model that viewed it.
func (t *Trainer) releaseDevice() error {
	d := t.device
	if d == nil {
		return nil
	}
	t.device = nil
	return errors.Join(d.rt.OnDevice(d.dev, func() error { return d.rt.Free(d.p) }), d.rt.Close())
}
