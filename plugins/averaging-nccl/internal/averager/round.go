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
	res.WaitMS = ms(time.Since(wait))
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
	res.ReduceMS = ms(time.Since(reduce))
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

// ensureSession lays the session out over the GPUs and builds its
// communicator unless that is done, all within init_timeout.
func (a *Averager) ensureSession(ctx context.Context) error {
	s := &a.sess
	if s.failed != nil {
		return fmt.Errorf("%w: session %d failed (%v); waiting for a new session", plugin.ErrRoundAborted, s.gen, s.failed)
	}
	if s.built {
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
		return errors.Join(fmt.Errorf("%w: session %d of %d ranks on device %d: %w", plugin.ErrRoundAborted, s.gen, len(s.members), a.device, err), a.dropSession())
	}
	s.built = true
	return nil
}

// gpuPost is what a member posts when a session is laid out: its device
// memory's size and handle, then its GPU's name.
type gpuPost struct {
	size   uint64
	handle backend.IPCHandle
	gpu    string
}

// maxGPUName bounds a posted GPU name (a boot id and a PCI bus id are
// under 64 bytes).
const maxGPUName = 256

func (p gpuPost) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, p.size)
	b = append(b, p.handle[:]...)
	return append(b, p.gpu...)
}

func decodeGPUPost(b []byte) (gpuPost, error) {
	var p gpuPost
	n := 8 + len(p.handle)
	if len(b) <= n || len(b) > n+maxGPUName {
		return p, fmt.Errorf("%d bytes, not a size, a handle and a GPU name of 1 to %d bytes", len(b), maxGPUName)
	}
	p.size = binary.LittleEndian.Uint64(b)
	copy(p.handle[:], b[8:])
	p.gpu = string(b[n:])
	return p, nil
}

// build groups the members by GPU, has each GPU's leader map its mates'
// memory and the others their leader's, and, with several GPUs, builds
// the leaders' communicator.
func (a *Averager) build(ctx context.Context) error {
	s := &a.sess
	post := gpuPost{size: uint64(a.mem.Len()), handle: a.handle, gpu: a.gpuName}.encode()
	key := fmt.Sprintf("nccl-gpu/g%d", s.gen)
	got, err := a.relay.Exchange(ctx, key, post)
	if err != nil {
		return fmt.Errorf("relay exchange %s: %w", key, err)
	}
	places := map[uint32]gpuPost{}
	onGPU := map[string][]uint32{}
	for _, m := range s.members {
		p, err := decodeGPUPost(got[m])
		if err != nil {
			return fmt.Errorf("relay exchange %s: rank %d's post: %w", key, m, err)
		}
		if p.size != uint64(a.mem.Len()) {
			return fmt.Errorf("relay exchange %s: rank %d's device memory is %d bytes, this rank's %d (another layout?)", key, m, p.size, a.mem.Len())
		}
		places[m] = p
		onGPU[p.gpu] = append(onGPU[p.gpu], m)
	}
	var leaders []uint32
	for _, ranks := range onGPU {
		slices.Sort(ranks)
		leaders = append(leaders, ranks[0])
	}
	slices.Sort(leaders)
	s.gpuIndex = map[uint32]int{}
	for i, l := range leaders {
		for _, m := range onGPU[places[l].gpu] {
			s.gpuIndex[m] = i
		}
	}
	mine := onGPU[places[a.rank].gpu]
	s.gpus, s.leader = len(leaders), mine[0]
	s.lead = s.leader == a.rank
	if !s.lead {
		// The leader reads and writes this rank's memory; this rank
		// never touches the leader's.
		mine = nil
	}
	for _, m := range mine[min(1, len(mine)):] {
		mem, err := a.be.Open(a.device, places[m].handle, a.mem.Len())
		if err != nil {
			return fmt.Errorf("map rank %d's device memory (both on GPU %s): %w", m, places[m].gpu, err)
		}
		s.mates = append(s.mates, mate{rank: m, mem: mem})
	}
	if s.gpus == 1 {
		return nil // one GPU: its leader's fold is the whole mean
	}
	// The lowest leader makes the unique id; every member posts, as the
	// relay wants, and only leaders build their part.
	creator := leaders[0]
	var blob []byte
	if a.rank == creator {
		id, err := a.be.NewUniqueID()
		if err != nil {
			return err
		}
		blob = id[:]
	}
	key = fmt.Sprintf("nccl-id/g%d", s.gen)
	if got, err = a.relay.Exchange(ctx, key, blob); err != nil {
		return fmt.Errorf("relay exchange %s: %w", key, err)
	}
	if !s.lead {
		return nil
	}
	var id backend.UniqueID
	if len(got[creator]) != len(id) {
		return fmt.Errorf("relay exchange %s: rank %d posted %d bytes, not a unique id of %d", key, creator, len(got[creator]), len(id))
	}
	copy(id[:], got[creator])
	comm, err := a.be.InitComm(ctx, id, s.gpus, a.gpuOf(a.rank), a.device)
	if err != nil {
		return err
	}
	s.comm = comm
	return nil
}

// exchange posts blob under the round's key for step and returns every
// member's post; it is also the round's barrier.
func (a *Averager) exchange(ctx context.Context, step string, round uint64, blob []byte) (map[uint32][]byte, error) {
	key := fmt.Sprintf("nccl-%s/g%d/r%d", step, a.sess.gen, round)
	got, err := a.relay.Exchange(ctx, key, blob)
	if err != nil {
		return nil, fmt.Errorf("relay exchange %s: %w", key, err)
	}
	return got, nil
}

// weighing is one member's part in a mean: its weight, whether it
// trained, and its smoothing setting and step count.
type weighing struct {
	w, trained, sm float64
	steps          uint64
}

const weighingSize = 32

func (x weighing) encode() []byte {
	b := make([]byte, 0, weighingSize)
	for _, v := range []float64{x.w, x.trained, x.sm} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return binary.LittleEndian.AppendUint64(b, x.steps)
}

func decodeWeighing(b []byte) (weighing, error) {
	if len(b) != weighingSize {
		return weighing{}, fmt.Errorf("%d bytes, not a weighing of %d", len(b), weighingSize)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])) }
	return weighing{w: f(0), trained: f(1), sm: f(2), steps: binary.LittleEndian.Uint64(b[24:])}, nil
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

// gpuOf is the NCCL rank of rank's GPU: its leader's place among the
// leaders, which the layout put in rank order. Every member computes it
// from the same session.
func (a *Averager) gpuOf(rank uint32) int { return a.sess.gpuIndex[rank] }

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

// norm is the L2 norm of the f32 parameters, where they are.
func (a *Averager) norm() (float64, error) {
	if a.onDevice {
		n, err := a.be.Norm(a.mem, 0, a.np)
		if err != nil {
			return 0, fmt.Errorf("the parameters' norm on the device: %w", err)
		}
		return n, nil
	}
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
	return math.Sqrt(sum), nil
}
