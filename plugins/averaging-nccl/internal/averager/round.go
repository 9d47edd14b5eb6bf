package averager

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// span is one f32 entry of the arena: its first element and length, and
// whether it is a parameter (weighted by steps) or a buffer (averaged
// equally among the ranks that trained).
type span struct {
	off, n int
	param  bool
}

// buildSpans lists the arena's f32 entries, parameters first. Other
// parameter types are refused; other buffer types stay local.
func buildSpans(l arena.Layout) (spans []span, np, nb int, err error) {
	if err := l.Validate(); err != nil {
		return nil, 0, 0, fmt.Errorf("averager: %w", err)
	}
	for pass := range 2 {
		for _, e := range l.Entries {
			if (pass == 0) != (e.Role == arena.Parameter) {
				continue
			}
			if e.DType != arena.F32 {
				if e.Role == arena.Parameter {
					return nil, 0, 0, fmt.Errorf("averager: parameter %q is %v; averaging-nccl averages f32 parameters only", e.Name, e.DType)
				}
				continue
			}
			n := int(e.Bytes / 4)
			spans = append(spans, span{off: int(e.Offset / 4), n: n, param: pass == 0})
			if pass == 0 {
				np += n
			} else {
				nb += n
			}
		}
	}
	return spans, np, nb, nil
}

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
	res.TotalMS = ms(time.Since(start))
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (a *Averager) round(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	s := &a.sess
	if r.Broadcast && int(r.Root) >= len(s.members) {
		return plugin.RoundResult{}, fmt.Errorf("broadcast root %d is not a rank of session %d (%d members)", r.Root, s.gen, len(s.members))
	}
	w := a.cfg.weight(r.Steps)
	res := plugin.RoundResult{Weight: w, PreNorm: a.norm()}
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
	if err := a.ensureComm(ctx); err != nil {
		return plugin.RoundResult{}, err
	}
	res.WaitMS = ms(time.Since(wait))
	reduce := time.Now()
	var err error
	if r.Broadcast {
		err = a.broadcast(ctx, int(r.Root))
		res.Realized = err == nil
	} else {
		res.TotalWeight, res.Realized, err = a.mean(ctx, w)
	}
	if err != nil {
		// The backend aborted the communicator; so is the session.
		s.failed = err
		return plugin.RoundResult{}, errors.Join(fmt.Errorf("%w: session %d: %w", plugin.ErrRoundAborted, s.gen, err), a.dropComm())
	}
	res.ReduceMS = ms(time.Since(reduce))
	if res.Realized {
		res.BytesMoved = uint64(len(a.staging))
		// The staging buffer went to the device and came back (a
		// broadcast's non-root only reads it back).
		res.HostCopyBytes = 2 * uint64(len(a.staging))
		if r.Broadcast && int(r.Root) != s.rank {
			res.HostCopyBytes = uint64(len(a.staging))
		}
	}
	res.PostNorm = a.norm()
	return res, nil
}

// ensureComm builds the session's communicator unless it has one: the
// lowest member makes the unique id, the relay carries it, and every
// member joins, all within init_timeout.
func (a *Averager) ensureComm(ctx context.Context) error {
	s := &a.sess
	if s.failed != nil {
		return fmt.Errorf("%w: session %d's communicator failed (%v); waiting for a new session", plugin.ErrRoundAborted, s.gen, s.failed)
	}
	if s.comm != nil {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, a.cfg.initTimeout)
	defer cancel()
	err := a.build(ictx)
	if err != nil && ctx.Err() == nil && errors.Is(ictx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("not built within init_timeout %v (a member never came?): %w", a.cfg.initTimeout, err)
	}
	if err != nil {
		s.failed = err
		return fmt.Errorf("%w: session %d: communicator of %d ranks on device %d: %w", plugin.ErrRoundAborted, s.gen, len(s.members), a.device, err)
	}
	return nil
}

func (a *Averager) build(ctx context.Context) error {
	s := &a.sess
	creator := slices.Min(s.members)
	var blob []byte
	if s.members[s.rank] == creator {
		id, err := a.be.NewUniqueID()
		if err != nil {
			return err
		}
		blob = id[:]
	}
	key := fmt.Sprintf("nccl-id/g%d", s.gen)
	got, err := a.relay.Exchange(ctx, key, blob)
	if err != nil {
		return fmt.Errorf("relay exchange %s: %w", key, err)
	}
	var id backend.UniqueID
	if len(got[creator]) != len(id) {
		return fmt.Errorf("relay exchange %s: rank %d posted %d bytes, not a unique id of %d", key, creator, len(got[creator]), len(id))
	}
	copy(id[:], got[creator])
	comm, err := a.be.InitComm(ctx, id, len(s.members), s.rank, a.device)
	if err != nil {
		return err
	}
	data, err := comm.Alloc(max(len(a.staging), 4))
	if err != nil {
		return errors.Join(err, comm.Abort())
	}
	weights, err := comm.Alloc(8 * weightSums)
	if err != nil {
		return errors.Join(err, comm.Abort())
	}
	s.comm, s.data, s.weights = comm, data, weights
	return nil
}

// mean leaves Σ wᵢxᵢ / Σ wᵢ in the parameters and the plain mean of the
// ranks that trained in the buffers: the weights are all-reduced first
// (in f64), then each rank scales its values by its share and the shares
// are summed. With no weight anywhere the arena is left as it is.
func (a *Averager) mean(ctx context.Context, w float64) (total float64, realized bool, err error) {
	s := &a.sess
	trained := 0.0
	if w > 0 {
		trained = 1
	}
	// Beside the weights, the smoothing filter's settings and step counts,
	// summed with their squares: equal on every rank exactly when
	// sum² = n·Σx².
	var sm, steps float64
	if a.smooth != nil {
		sm, steps = float64(a.smooth.outer.Mu), float64(a.smooth.steps)
	}
	sums := [weightSums]float64{w, trained, sm, sm * sm, steps, steps * steps}
	wb := make([]byte, 8*weightSums)
	for i, v := range sums {
		binary.LittleEndian.PutUint64(wb[8*i:], math.Float64bits(v))
	}
	if err := s.weights.Write(wb); err != nil {
		return 0, false, err
	}
	if err := s.comm.AllReduceSum(ctx, s.weights, backend.Float64); err != nil {
		return 0, false, err
	}
	if err := s.weights.Read(wb); err != nil {
		return 0, false, err
	}
	for i := range sums {
		sums[i] = math.Float64frombits(binary.LittleEndian.Uint64(wb[8*i:]))
	}
	n := float64(len(s.members))
	if !agree(sums[2], sums[3], n) {
		return 0, false, fmt.Errorf("the ranks' smoothing settings differ (this rank's is %v): every rank needs the same", sm)
	}
	total = sums[0]
	ranks := sums[1]
	if !(total > 0) || !(ranks > 0) {
		return total, false, nil
	}
	a.pack(float32(w/total), float32(trained/ranks))
	if err := s.data.Write(a.staging); err != nil {
		return 0, false, err
	}
	if err := s.comm.AllReduceSum(ctx, s.data, backend.Float32); err != nil {
		return 0, false, err
	}
	if err := s.data.Read(a.staging); err != nil {
		return 0, false, err
	}
	if a.smooth != nil {
		// The parameters lead the staging buffer (buildSpans).
		seed := a.smooth.steps == 0 || !agree(sums[4], sums[5], n)
		if seed && a.smooth.steps != 0 {
			a.log.Warn("the ranks' smoothing states differ: reseeding from this round's consensus")
		}
		a.smooth.step(arena.AsFloat32s(a.staging)[:a.np], seed)
	}
	a.unpack()
	return total, true, nil
}

// weightSums is how many float64 sums a round's first all-reduce carries:
// the weight, whether the rank trained, and the smoothing setting and
// step count with their squares.
const weightSums = 6

// broadcast copies the root's f32 entries into every member's arena.
func (a *Averager) broadcast(ctx context.Context, root int) error {
	s := &a.sess
	if s.rank == root {
		a.pack(1, 1)
		if err := s.data.Write(a.staging); err != nil {
			return err
		}
	}
	if err := s.comm.Broadcast(ctx, s.data, backend.Float32, root); err != nil {
		return err
	}
	if err := s.data.Read(a.staging); err != nil {
		return err
	}
	a.unpack()
	return nil
}

// pack writes the arena's f32 entries into the staging buffer, parameters
// scaled by pw and buffers by bw (1 copies them bit for bit).
func (a *Averager) pack(pw, bw float32) {
	all := arena.AsFloat32s(a.arena.Bytes())
	dst := arena.AsFloat32s(a.staging)
	i := 0
	for _, sp := range a.spans {
		k := bw
		if sp.param {
			k = pw
		}
		for j, x := range all[sp.off : sp.off+sp.n] {
			dst[i+j] = x * k
		}
		i += sp.n
	}
}

// unpack writes the staging buffer back into the arena's f32 entries.
func (a *Averager) unpack() {
	all := arena.AsFloat32s(a.arena.Bytes())
	src := arena.AsFloat32s(a.staging)
	i := 0
	for _, sp := range a.spans {
		copy(all[sp.off:sp.off+sp.n], src[i:i+sp.n])
		i += sp.n
	}
}

// norm is the L2 norm of the f32 parameters.
func (a *Averager) norm() float64 {
	all := arena.AsFloat32s(a.arena.Bytes())
	var sum float64
	for _, sp := range a.spans {
		if !sp.param {
			continue
		}
		for _, x := range all[sp.off : sp.off+sp.n] {
			sum += float64(x) * float64(x)
		}
	}
	return math.Sqrt(sum)
}
