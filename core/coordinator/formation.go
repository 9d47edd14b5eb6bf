package coordinator

import (
	"bytes"
	"fmt"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/link"
	"github.com/cohortdl/cohort/core/coordinator/record"

	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// onJoined takes a rank whose handshake succeeded into the forming cohort
// and sends it Admit: what every rank must share to train together.
func (r *runner) onJoined(rs *rankState, conn *wire.Conn) {
	if r.phase != phForming || rs.status != stAbsent {
		// The slot check makes this impossible; never let a second
		// connection take over a rank.
		r.log.Warn("dropping an unexpected connection", "rank", rs.id, "phase", r.phase.String())
		conn.Close()
		return
	}
	rs.link = link.New(rs.id, conn)
	r.setStatus(rs, stJoined)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		rs.link.Run(r.ctx, r.events)
	}()
	r.log.Info("rank joined", "rank", rs.id, "remote", conn.RemoteAddr().String())
	admit := &wirepb.Admit{
		RunId:     r.c.runID,
		Seed:      uint64(r.cfg.Run.Seed),
		ResumeDir: r.c.resume,
		Epochs:    uint64(r.cfg.Run.Epochs),
		// Async rounds run beside training where the trainer can.
		OverlapRounds: r.policy == config.PolicyAsync && r.cfg.Coordinator.AsyncOverlap,
	}
	r.send(rs, admit)
}

// onReady checks a rank's Ready against rank 0's.
func (r *runner) onReady(rs *rankState, m *wirepb.Ready) {
	if r.phase != phForming || rs.status != stJoined {
		r.log.Warn("ignoring a Ready outside formation", "rank", rs.id, "phase", r.phase.String())
		return
	}
	rs.ready = m
	r.setStatus(rs, stReady)
	ref := r.ranks[0]
	if rs.id == 0 {
		if m.GetSamples() == 0 || m.GetBatchSize() == 0 {
			r.refuse(rs, fmt.Sprintf("its trainer has %d samples and batch size %d", m.GetSamples(), m.GetBatchSize()))
			return
		}
		for _, o := range r.ranks[1:] {
			if o.status == stReady {
				r.verifyReady(o, m)
			}
		}
		return
	}
	if ref.status == stReady {
		r.verifyReady(rs, ref.ready)
	}
}

func (r *runner) verifyReady(rs *rankState, ref *wirepb.Ready) {
	m := rs.ready
	switch {
	case !bytes.Equal(m.GetLayoutDigest(), ref.GetLayoutDigest()):
		r.refuse(rs, fmt.Sprintf("its parameter layout digest %x differs from rank 0's %x (another model?)", m.GetLayoutDigest(), ref.GetLayoutDigest()))
	case m.GetSamples() != ref.GetSamples():
		r.refuse(rs, fmt.Sprintf("its trainer has %d samples, rank 0's has %d", m.GetSamples(), ref.GetSamples()))
	case m.GetBatchSize() != ref.GetBatchSize():
		r.refuse(rs, fmt.Sprintf("its batch size is %d, rank 0's is %d", m.GetBatchSize(), ref.GetBatchSize()))
	}
}

// refuse drops a rank at formation; its slot is free for a corrected
// process, and the formation timeout reports the reason if none comes.
func (r *runner) refuse(rs *rankState, why string) {
	msg := fmt.Sprintf("rank %d: %s", rs.id, why)
	r.refusals = append(r.refusals, msg)
	r.log.Warn("refused a rank at formation", "rank", rs.id, "reason", why)
	r.dropUnformed(rs)
}

// tryForm forms the cohort once every rank is Ready.
func (r *runner) tryForm() bool {
	for _, rs := range r.ranks {
		if rs.status != stReady {
			return false
		}
	}
	ref := r.ranks[0].ready
	r.pickSpace = ref.GetSamples()
	r.batch = uint64(ref.GetBatchSize())
	if m := r.c.meta; m != nil && m.PickSpace != r.pickSpace {
		r.finish(record.StatusFailed, fmt.Errorf("coordinator: resume: checkpoint %s was taken with %d samples, the trainer now has %d",
			r.c.resume, m.PickSpace, r.pickSpace))
		return true
	}
	for _, rs := range r.ranks {
		r.setStatus(rs, stLive)
	}
	r.phase = phTraining
	r.log.Info("cohort formed", "ranks", r.world, "samples", r.pickSpace, "batch_size", r.batch,
		"trainer", ref.GetTrainer(), "averager", ref.GetAverager(), "seconds", time.Since(r.started).Seconds())
	var cad *dispatch.CadenceState
	if m := r.c.meta; m != nil {
		cad = m.Cadence
	}
	r.disp.Form(r.pickSpace, r.batch, cad)
	r.emit(Progress{Kind: ProgressFormed})
	r.formRole()
	// Every rank starts from rank 0's parameters (after a resume: from
	// what rank 0 loaded).
	r.issueRound(wirepb.SyncMode_SYNC_MODE_BROADCAST, 0, true)
	return true
}

func (r *runner) formationError() error {
	var joined, ready []uint32
	for _, rs := range r.ranks {
		if rs.status >= stJoined {
			joined = append(joined, rs.id)
		}
		if rs.status >= stReady {
			ready = append(ready, rs.id)
		}
	}
	err := fmt.Errorf("coordinator: formation: %d/%d ranks ready within %v (joined %v, ready %v)",
		len(ready), r.world, r.cfg.Coordinator.FormationTimeout, joined, ready)
	if len(r.refusals) > 0 {
		err = fmt.Errorf("%w; refused: %s", err, r.refusals[len(r.refusals)-1])
	}
	return err
}

// dropUnformed forgets a rank that has not joined the formed cohort and
// frees its slot.
func (r *runner) dropUnformed(rs *rankState) {
	if rs.link != nil {
		rs.link.Close()
		rs.link = nil
	}
	r.setStatus(rs, stAbsent)
	rs.ready = nil
	r.slots.Release(rs.id)
	r.meet.Left(rs.id)
}
