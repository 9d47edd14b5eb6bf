package averager

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/atomicfile"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// smoother is the smoothing filter (the setting's doc says what it does),
// as averaging-cpu runs it: slow momentum at unit gain on the parameters'
// consensus. Every rank keeps the same state and steps it on the same
// consensus, so they stay equal without another collective; each round's
// weights, which every rank posts, carry the ranks' step counts, and ranks
// that find them unequal (a replaced plugin, a checkpoint loaded on some
// ranks only, a round one rank failed) all reseed from that round's
// consensus.
type smoother struct {
	outer     numeric.Outer
	prev, vel []float32 // over the parameter elements, in span order
	steps     uint64    // realized rounds stepped since the seed; 0: seed next
	// dev, when the parameters are on the device, holds prev and vel
	// there (prev and vel above then only carry them to and from a
	// checkpoint) and a scratch vector.
	dev *devState
}

type devState struct {
	be             backend.Backend
	prev, vel, tmp backend.Memory
}

// onDevice moves the filter's state to device memory on dev.
func (m *smoother) onDevice(be backend.Backend, dev int) error {
	d := &devState{be: be}
	m.dev = d
	for _, p := range []*backend.Memory{&d.prev, &d.vel, &d.tmp} {
		var err error
		if *p, err = be.Alloc(dev, max(4*len(m.prev), 4)); err != nil {
			return err
		}
	}
	return nil
}

// release frees the device state, if any.
func (m *smoother) release() error {
	d := m.dev
	if d == nil {
		return nil
	}
	m.dev = nil
	var errs []error
	for _, p := range []backend.Memory{d.prev, d.vel, d.tmp} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

// stepDevice is step on the device, over the first np elements of c:
// with g = prev − c, v = mu·v + g and c = prev − lr·v, then prev = c; a
// seed sets prev = c and v = 0, leaving c.
func (m *smoother) stepDevice(c backend.Memory, np int, seed bool) error {
	d, be := m.dev, m.dev.be
	var err error
	if seed {
		err = errors.Join(be.CopyRange(d.prev, 0, c, 0, np), d.vel.Write(make([]byte, 4*np)))
	} else {
		lr, mu := m.outer.LR, m.outer.Mu
		err = errors.Join(
			be.CopyRange(d.tmp, 0, d.prev, 0, np),
			be.Axpy(d.tmp, c, 0, np, -1),
			be.Scale(d.vel, 0, np, mu),
			be.Axpy(d.vel, d.tmp, 0, np, 1),
			be.CopyRange(c, 0, d.prev, 0, np),
			be.Axpy(c, d.vel, 0, np, -lr),
			be.CopyRange(d.prev, 0, c, 0, np))
	}
	if err != nil {
		return fmt.Errorf("smoothing on the device: %w", err)
	}
	if seed {
		m.steps = 1
	} else {
		m.steps++
	}
	return nil
}

// toHost and toDevice carry a device state to prev and vel, for a
// checkpoint, and back.
func (m *smoother) toHost() error {
	if m.dev == nil {
		return nil
	}
	for _, x := range []struct {
		src backend.Memory
		dst []float32
	}{{m.dev.prev, m.prev}, {m.dev.vel, m.vel}} {
		b := make([]byte, 4*len(x.dst))
		if err := x.src.Read(b); err != nil {
			return err
		}
		copy(x.dst, arena.AsFloat32s(b))
	}
	return nil
}

func (m *smoother) toDevice() error {
	if m.dev == nil {
		return nil
	}
	for _, x := range []struct {
		dst backend.Memory
		src []float32
	}{{m.dev.prev, m.prev}, {m.dev.vel, m.vel}} {
		b := make([]byte, 4*len(x.src))
		copy(arena.AsFloat32s(b), x.src)
		if err := x.dst.Write(b); err != nil {
			return err
		}
	}
	return nil
}

func newSmoother(s float64, np int) *smoother {
	return &smoother{outer: numeric.Outer{Kind: numeric.OuterSlowMo, LR: float32(1 - s), Mu: float32(s)},
		prev: make([]float32, np), vel: make([]float32, np)}
}

// step filters the consensus c of the parameters in place; seed starts the
// filter afresh from it.
func (m *smoother) step(c []float32, seed bool) {
	m.outer.Step(c, m.prev, m.vel, seed)
	if seed {
		m.steps = 1
	} else {
		m.steps++
	}
}

// stateFile is where SaveState writes the filter, in the checkpoint's
// rank directory.
const stateFile = "averager-nccl-smoothing.bin"

var stateMagic = []byte("cohort-nccl-smoothing-v1\n")

// encode is magic | elements u64 | steps u64 | prev f32… | vel f32… |
// SHA-256 of all before it.
func (m *smoother) encode() []byte {
	b := append([]byte(nil), stateMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(m.prev)))
	b = binary.LittleEndian.AppendUint64(b, m.steps)
	for _, v := range [][]float32{m.prev, m.vel} {
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

// decode restores m from b, refusing a file of another size or content
// before it reads a value.
func (m *smoother) decode(b []byte) error {
	head := len(stateMagic) + 16
	want := head + 8*len(m.prev) + sha256.Size
	switch {
	case len(b) < head || !bytes.Equal(b[:len(stateMagic)], stateMagic):
		return errors.New("not an averaging-nccl smoothing state")
	case binary.LittleEndian.Uint64(b[len(stateMagic):]) != uint64(len(m.prev)):
		return fmt.Errorf("state of %d parameters, this model has %d", binary.LittleEndian.Uint64(b[len(stateMagic):]), len(m.prev))
	case len(b) != want:
		return fmt.Errorf("%d bytes, want %d", len(b), want)
	}
	body := b[:want-sha256.Size]
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], b[want-sha256.Size:]) {
		return errors.New("checksum mismatch")
	}
	steps := binary.LittleEndian.Uint64(b[len(stateMagic)+8:])
	vals := arena.AsFloat32s(append([]byte(nil), body[head:]...))
	copy(m.prev, vals[:len(m.prev)])
	copy(m.vel, vals[len(m.prev):])
	m.steps = steps
	return nil
}

// SaveState writes the smoothing filter's state into dir (nothing when
// smoothing is off), atomically.
func (a *Averager) SaveState(_ context.Context, dir string) ([]string, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.smooth == nil {
		return nil, nil
	}
	if err := a.smooth.toHost(); err != nil {
		return nil, fmt.Errorf("averager: read the smoothing state off the device: %w", err)
	}
	path := filepath.Join(dir, stateFile)
	if err := atomicfile.WriteBytes(path, a.smooth.encode()); err != nil {
		return nil, fmt.Errorf("averager: save smoothing state: %w", err)
	}
	return []string{path}, nil
}

// LoadState restores the filter from dir; a directory without the file
// leaves it to seed at the next round.
func (a *Averager) LoadState(_ context.Context, dir string) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.smooth == nil {
		return nil
	}
	path := filepath.Join(dir, stateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		a.smooth.steps = 0
		return nil
	}
	if err == nil {
		err = a.smooth.decode(b)
	}
	if err == nil {
		err = a.smooth.toDevice()
	}
	if err != nil {
		return fmt.Errorf("averager: load smoothing state %s: %w", path, err)
	}
	return nil
}
