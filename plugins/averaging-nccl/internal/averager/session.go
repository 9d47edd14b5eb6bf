package averager

// A session's layout over the GPUs: who shares a GPU with whom, who leads
// it, whose memory a leader maps, and the leaders' communicator.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
	"github.com/cohortdl/cohort/shared/plugin"
)

// session is one membership; a session of several members is laid out
// over the GPUs, and its communicator built, at its first round.
type session struct {
	gen     uint64
	members []uint32
	rank    int
	built   bool
	// gpus is how many GPUs the members are on; gpuIndex is each
	// member's GPU among them (ordered by their leaders' ranks): its
	// leader's rank in NCCL.
	gpus     int
	gpuIndex map[uint32]int
	// leader is the lowest rank on this rank's GPU, which folds its GPU's
	// ranks and joins the communicator; lead says this rank is it.
	leader uint32
	lead   bool
	// mates are a leader's other ranks on its GPU, their memory mapped.
	mates []mate
	comm  backend.Comm // a leader's, when there are several GPUs
	// failed is why the session could not be built or a round failed:
	// rounds are refused until the next session.
	failed error
}

// mate is another rank on this rank's GPU, with its device memory mapped.
type mate struct {
	rank uint32
	mem  backend.Memory
}

// shared reports whether some GPU holds more than one member.
func (s *session) shared() bool { return s.gpus < len(s.members) }

// dropSession aborts the session's communicator, if any (ncclCommAbort
// never waits on peers, which after a membership change may be gone), and
// unmaps the other ranks' memory.
func (a *Averager) dropSession() error {
	s := &a.sess
	var errs []error
	if s.comm != nil {
		errs = append(errs, s.comm.Abort())
		s.comm = nil
	}
	for _, m := range s.mates {
		errs = append(errs, m.mem.Close())
	}
	s.mates, s.built = nil, false
	return errors.Join(errs...)
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

// gpuOf is the NCCL rank of rank's GPU: its leader's place among the
// leaders, which the layout put in rank order. Every member computes it
// from the same session.
func (a *Averager) gpuOf(rank uint32) int { return a.sess.gpuIndex[rank] }
