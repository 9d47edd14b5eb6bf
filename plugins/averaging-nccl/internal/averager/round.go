package averager

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Average runs one round; it returns when the arena holds the result.
func (a *Averager) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	start := time.Now()
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.arena == nil {
		return plugin.RoundResult{}, fmt.Errorf("averager: round %d: Average before Configure", r.Round)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	if a.aborted {
		reason := a.reason
		a.mu.Unlock()
		return plugin.RoundResult{}, fmt.Errorf("averager: round %d: %w (%s); waiting for a new session", r.Round, ErrAborted, reason)
	}
	a.cancel = cancel
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.cancel = nil
		a.mu.Unlock()
	}()
	res, err := a.round(ctx, r)
	if err != nil {
		a.mu.Lock()
		aborted, reason := a.aborted, a.reason
		a.mu.Unlock()
		if aborted {
			return plugin.RoundResult{}, fmt.Errorf("averager: round %d: %w (%s): %w", r.Round, ErrAborted, reason, err)
		}
		return plugin.RoundResult{}, fmt.Errorf("averager: round %d: %w", r.Round, err)
	}
	res.TotalMS = plugin.Milliseconds(time.Since(start))
	return res, nil
}

func (a *Averager) round(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	s := &a.sess
	if r.Broadcast && int(r.Root) >= len(s.members) {
		return plugin.RoundResult{}, fmt.Errorf("broadcast root %d is not a rank of session %d (%d members)", r.Root, s.gen, len(s.members))
	}
	w := a.cfg.weight(r.Steps)
	pre, err := a.norm()
	if err != nil {
		return plugin.RoundResult{}, err
	}
	res := plugin.RoundResult{Weight: w, PreNorm: pre}
	if len(s.members) == 1 {
		// A lone member's mean, or broadcast, is its own values; the
		// smoothing filter starts afresh should the cohort grow again.
		if a.smooth != nil {
			a.smooth.steps = 0
		}
		res.TotalWeight, res.PostNorm, res.Realized = w, res.PreNorm, w > 0 || r.Broadcast
		return res, nil
	}
	wait := time.Now()
	if err := a.ensureSession(ctx); err != nil {
		return plugin.RoundResult{}, err
	}
	res.WaitMS = plugin.Milliseconds(time.Since(wait))
	reduce := time.Now()
	if r.Broadcast {
		err = a.broadcast(ctx, r.Round, int(r.Root))
		res.Realized = err == nil
	} else {
		res.TotalWeight, res.Realized, err = a.mean(ctx, r.Round, w)
	}
	if err != nil {
		// A rank gone mid-round, a failed collective or fold: the
		// session is over, and so is its communicator.
		s.failed = err
		return plugin.RoundResult{}, errors.Join(fmt.Errorf("%w: session %d: %w", plugin.ErrRoundAborted, s.gen, err), a.dropSession())
	}
	res.ReduceMS = plugin.Milliseconds(time.Since(reduce))
	if res.Realized {
		size := uint64(4 * (a.np + a.nb))
		res.BytesMoved = size
		// The staging buffer went to the device and came back (a
		// broadcast's non-root only reads it back); the trainer's own
		// block never leaves it.
		switch {
		case a.onDevice:
		case r.Broadcast && int(r.Root) != s.rank:
			res.HostCopyBytes = size
		default:
			res.HostCopyBytes = 2 * size
		}
	}
	if res.PostNorm, err = a.norm(); err != nil {
		return plugin.RoundResult{}, err
	}
	return res, nil
}

// mean leaves Σ wᵢxᵢ / Σ wᵢ in the parameters and the plain mean of the
// ranks that trained in the buffers. The weights are summed first
// (weighAll or weighSums); each rank's values are then scaled by its
// share (each GPU's leader scales its mates' as it folds them), the
// leaders sum across GPUs, and write the sum back to their mates. With no
// weight anywhere the parameters are left as they are.
func (a *Averager) mean(ctx context.Context, round uint64, w float64) (total float64, realized bool, err error) {
	s := &a.sess
	me := weighing{w: w}
	if w > 0 {
		me.trained = 1
	}
	if a.smooth != nil {
		me.sm, me.steps = float64(a.smooth.outer.Mu), a.smooth.steps
	}
	if s.shared() && !a.onDevice {
		// The leader scales this rank's values on the device: they go
		// there as they are, before the weights, which also tell the
		// leader they are in place.
		a.pack(1, 1)
		if err := a.mem.Write(a.staging); err != nil {
			return 0, false, err
		}
	}
	var ws map[uint32]weighing
	var ranks float64
	var sameSteps bool
	if s.shared() {
		ws, total, ranks, sameSteps, err = a.weighAll(ctx, round, me)
	} else {
		total, ranks, sameSteps, err = a.weighSums(ctx, me)
		ws = map[uint32]weighing{a.rank: me}
	}
	if err != nil {
		return 0, false, err
	}
	if !(total > 0) || !(ranks > 0) {
		return total, false, nil
	}
	share := func(m uint32) (p, b float32) { return float32(ws[m].w / total), float32(ws[m].trained / ranks) }
	if s.shared() {
		var ferr error
		if s.lead {
			ferr = a.fold(ctx, share)
		}
		if err := a.done(ctx, round, ferr); err != nil {
			return 0, false, err
		}
	} else {
		if err := a.scaled(share(a.rank)); err != nil {
			return 0, false, err
		}
		if err := s.comm.AllReduceSum(ctx, a.mem, backend.Float32); err != nil {
			return 0, false, err
		}
	}
	if !a.onDevice {
		if err := a.mem.Read(a.staging); err != nil {
			return 0, false, err
		}
	}
	if a.smooth != nil {
		// The parameters lead the staging buffer and the trainer's block.
		seed := a.smooth.steps == 0 || !sameSteps
		if seed && a.smooth.steps != 0 {
			a.log.Warn("the ranks' smoothing states differ: reseeding from this round's consensus")
		}
		if a.onDevice {
			if err := a.smooth.stepDevice(a.mem, a.np, seed); err != nil {
				return 0, false, err
			}
		} else {
			a.smooth.step(arena.AsFloat32s(a.staging)[:a.np], seed)
		}
	}
	if !a.onDevice {
		a.unpack()
	}
	return total, true, nil
}

// scaled leaves this rank's values times its shares in its device memory:
// scaled on the host as they are copied there, or in place on the device.
func (a *Averager) scaled(p, b float32) error {
	if a.onDevice {
		return a.scaleOnDevice(p, b)
	}
	a.pack(p, b)
	return a.mem.Write(a.staging)
}

// scaleOnDevice multiplies this rank's device memory, parameters by p and
// buffers by b.
func (a *Averager) scaleOnDevice(p, b float32) error {
	if err := errors.Join(a.be.Scale(a.mem, 0, a.np, p), a.be.Scale(a.mem, a.np, a.nb, b)); err != nil {
		return fmt.Errorf("scale by the rank's share: %w", err)
	}
	return nil
}

// weighAll has every member post its weighing through the relay: on
// shared GPUs each leader needs its mates' shares, and the exchange also
// tells it their values are in place. It returns every member's, their
// sums, and whether the members' smoothing step counts agree.
func (a *Averager) weighAll(ctx context.Context, round uint64, me weighing) (ws map[uint32]weighing, total, ranks float64, sameSteps bool, err error) {
	got, err := a.exchange(ctx, "w", round, me.encode())
	if err != nil {
		return nil, 0, 0, false, err
	}
	ws, sameSteps = map[uint32]weighing{}, true
	for _, m := range a.sess.members {
		x, err := decodeWeighing(got[m])
		if err != nil {
			return nil, 0, 0, false, fmt.Errorf("rank %d's weight: %w", m, err)
		}
		if x.sm != me.sm {
			return nil, 0, 0, false, fmt.Errorf("the ranks' smoothing settings differ (this rank's is %v, rank %d's %v): every rank needs the same", me.sm, m, x.sm)
		}
		sameSteps = sameSteps && x.steps == me.steps
		ws[m] = x
		total += x.w
		ranks += x.trained
	}
	return ws, total, ranks, sameSteps, nil
}

// weighSums all-reduces the members' weighings (in f64) where every rank
// has a GPU of its own, so no round goes through the coordinator: the
// weight, whether the rank trained, and the smoothing setting and step
// count with their squares, which are equal on every rank exactly when
// sum² = n·Σx².
func (a *Averager) weighSums(ctx context.Context, me weighing) (total, ranks float64, sameSteps bool, err error) {
	s := &a.sess
	steps := float64(me.steps)
	sums := [weighSums]float64{me.w, me.trained, me.sm, me.sm * me.sm, steps, steps * steps}
	b := make([]byte, 8*weighSums)
	for i, v := range sums {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	if err := a.wmem.Write(b); err != nil {
		return 0, 0, false, err
	}
	if err := s.comm.AllReduceSum(ctx, a.wmem, backend.Float64); err != nil {
		return 0, 0, false, err
	}
	if err := a.wmem.Read(b); err != nil {
		return 0, 0, false, err
	}
	for i := range sums {
		sums[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	n := float64(len(s.members))
	if !agree(sums[2], sums[3], n) {
		return 0, 0, false, fmt.Errorf("the ranks' smoothing settings differ (this rank's is %v): every rank needs the same", me.sm)
	}
	return sums[0], sums[1], agree(sums[4], sums[5], n), nil
}

// weighSums is how many float64 sums weighSums all-reduces.
const weighSums = 6

// agree reports whether n ranks' values whose sum and sum of squares
// these are were all equal: then sum² = n·Σx², else it is smaller.
func agree(sum, squares, n float64) bool {
	return math.Abs(sum*sum-n*squares) <= 1e-9*math.Max(1, n*squares)
}

// fold is a leader's part of a mean on a shared GPU: its own values and
// its mates', each scaled by its share, summed into its memory, summed
// with the other GPUs' leaders, and written back into its mates' memory.
func (a *Averager) fold(ctx context.Context, share func(uint32) (p, b float32)) error {
	s := &a.sess
	if err := a.scaleOnDevice(share(a.rank)); err != nil {
		return fmt.Errorf("fold: %w", err)
	}
	for _, m := range s.mates {
		p, b := share(m.rank)
		if p != 0 {
			if err := a.be.Axpy(a.mem, m.mem, 0, a.np, p); err != nil {
				return fmt.Errorf("fold rank %d: %w", m.rank, err)
			}
		}
		if b != 0 {
			if err := a.be.Axpy(a.mem, m.mem, a.np, a.nb, b); err != nil {
				return fmt.Errorf("fold rank %d: %w", m.rank, err)
			}
		}
	}
	if s.comm != nil {
		if err := s.comm.AllReduceSum(ctx, a.mem, backend.Float32); err != nil {
			return err
		}
	}
	return a.spread()
}

// spread writes a leader's memory into its mates'.
func (a *Averager) spread() error {
	for _, m := range a.sess.mates {
		if err := a.be.CopyRange(m.mem, 0, a.mem, 0, a.np+a.nb); err != nil {
			return fmt.Errorf("write the result to rank %d: %w", m.rank, err)
		}
	}
	return nil
}

// broadcast copies the root's f32 entries into every member's arena.
func (a *Averager) broadcast(ctx context.Context, round uint64, root int) error {
	s := &a.sess
	rootRank := s.members[root]
	if s.rank == root && !a.onDevice {
		a.pack(1, 1)
		if err := a.mem.Write(a.staging); err != nil {
			return err
		}
	}
	if s.shared() {
		// The barrier tells the root's leader its values are in place.
		if _, err := a.exchange(ctx, "b", round, nil); err != nil {
			return err
		}
		var ferr error
		if s.lead {
			ferr = a.spreadRoot(ctx, rootRank)
		}
		if err := a.done(ctx, round, ferr); err != nil {
			return err
		}
	} else if err := s.comm.Broadcast(ctx, a.mem, backend.Float32, a.gpuOf(rootRank)); err != nil {
		return err
	}
	if a.onDevice {
		return nil
	}
	if err := a.mem.Read(a.staging); err != nil {
		return err
	}
	a.unpack()
	return nil
}

// spreadRoot is a leader's part of a broadcast on a shared GPU: the
// root's values into its memory (from its mate, or through the leaders'
// broadcast) and on into its mates'.
func (a *Averager) spreadRoot(ctx context.Context, root uint32) error {
	s := &a.sess
	for _, m := range s.mates {
		if m.rank == root {
			if err := a.be.CopyRange(a.mem, 0, m.mem, 0, a.np+a.nb); err != nil {
				return fmt.Errorf("take the root's values: %w", err)
			}
		}
	}
	if s.comm != nil {
		if err := s.comm.Broadcast(ctx, a.mem, backend.Float32, a.gpuOf(root)); err != nil {
			return err
		}
	}
	return a.spread()
}

// done is the barrier that ends a round on shared GPUs: each leader posts
// how its part went (nothing when it went well), so its mates learn at
// once that the result is in their memory, or why it is not.
func (a *Averager) done(ctx context.Context, round uint64, failed error) error {
	var blob []byte
	if failed != nil {
		blob = []byte(failed.Error())
		// The other GPUs' leaders may wait in a collective this one
		// never joins: the aborted communicator fails it for them.
		if c := a.sess.comm; c != nil {
			failed = errors.Join(failed, c.Abort())
		}
	}
	got, err := a.exchange(ctx, "done", round, blob)
	if failed != nil || err != nil {
		return errors.Join(failed, err)
	}
	if leader := a.sess.leader; !a.sess.lead {
		if why := got[leader]; len(why) > 0 {
			return fmt.Errorf("rank %d, this GPU's leader, failed the round: %s", leader, why)
		}
	}
	return nil
}
