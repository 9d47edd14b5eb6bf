// Package membership is who is in a run's cohort: each rank's place in it
// (absent, joined, ready, live, exited, dead) and its link, admission and
// formation, liveness (heartbeats, silent or broken links, ranks that stop
// reading), the re-formation of the averaging group after a death
// (Sessions), and the eval role (Role: the rank that evaluates, runs the
// epoch callback and saves the trained model).
//
// A Roster is the table of ranks and the one way to send them frames; the
// deaths it finds while the loop handles an event are queued, so a
// failure found in the middle of a broadcast never changes the set being
// iterated: the loop applies them after (NextDeath). What a departure
// means for the run (its work, its checkpoint, its round) is the
// coordinator's. Where things are:
//   - roster.go: the Roster, admission and formation, liveness
//   - session.go: re-forming the averaging group
//   - role.go: the eval role, and the evaluation it owes
//
// Neighbours: core/coordinator/link (each rank's Link) and
// core/coordinator/record (the role's history is kept there) below;
// core/coordinator's loop drives it, and the meeting hub sends through it.
package membership

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/coordinator/link"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// Status is one rank's place in the run.
type Status int

const (
	Absent Status = iota // no connection
	Joined               // handshake done, Admit sent
	Ready                // Ready accepted, waiting for the others
	Live                 // a member of the formed cohort
	Exited               // sent Exiting
	Dead                 // lost
)

// String names the status as the run's record and the status page do.
func (s Status) String() string {
	return [...]string{Absent: record.RankAbsent, Joined: record.RankJoined, Ready: record.RankReady,
		Live: record.RankLive, Exited: record.RankExited, Dead: record.RankDead}[s]
}

// rankState is what the roster knows of one rank.
type rankState struct {
	id     uint32
	status Status
	link   *link.Link
	ready  *wirepb.Ready
}

// Config is what a Roster starts from.
type Config struct {
	World uint32
	Slots *link.Slots // released when a rank is dropped before formation
	// HeartbeatTimeout is the silence that ends a link (for the reason a
	// death gives).
	HeartbeatTimeout time.Duration
	// Start runs a new link's sender; the caller tracks the goroutine.
	Start func(*link.Link)
	// Changed is told of every change of a rank's status.
	Changed func(rank uint32, st Status)
	// Dropped is told of a rank dropped before formation: it may come back.
	Dropped func(rank uint32)
	Logger  hclog.Logger
}

// Roster is the table of a run's ranks. Only the coordinator's loop
// calls it.
type Roster struct {
	cfg      Config
	log      hclog.Logger
	ranks    []*rankState
	refusals []string
	hbSeq    uint64      // the last CoordinatorHeartbeat's sequence
	deathQ   []deathNote // deaths found by the current handler, for NextDeath
	liveIDs  []uint32    // Live()'s answer while liveOK
	liveOK   bool
}

// deathNote is a death found while handling an event, applied after it.
type deathNote struct {
	rank   uint32
	reason string
}

// NewRoster is the roster of a world of absent ranks.
func NewRoster(cfg Config) *Roster {
	r := &Roster{cfg: cfg, log: cfg.Logger}
	for i := range cfg.World {
		r.ranks = append(r.ranks, &rankState{id: i})
	}
	return r
}

// Status is rank's place in the run.
func (r *Roster) Status(rank uint32) Status { return r.ranks[rank].status }

// ReadyOf is rank's Ready; nil before it sent one.
func (r *Roster) ReadyOf(rank uint32) *wirepb.Ready { return r.ranks[rank].ready }

// Current reports whether conn is rank's connection (an event of a
// connection already replaced or dropped is ignored).
func (r *Roster) Current(rank uint32, conn *wire.Conn) bool {
	rs := r.ranks[rank]
	return rs.link != nil && rs.link.Conn() == conn
}

// Send queues msg for rank; a rank whose queue is full is not reading and
// is noted dead.
func (r *Roster) Send(rank uint32, msg proto.Message) {
	rs := r.ranks[rank]
	if rs.link == nil || rs.status == Dead {
		return
	}
	if !rs.link.Queue(msg) {
		r.NoteDeath(rs.id, fmt.Sprintf("not reading: %d control frames queued", link.OutboxSize))
	}
}

// Live returns the ranks of the formed cohort that are still in it, in
// ascending order. The state machine asks after every event, so the list
// is kept between changes to it: a slice made anew on each change and
// never modified after, so a caller may hold it (a NewSession's members)
// but must not change it.
func (r *Roster) Live() []uint32 {
	if !r.liveOK {
		var out []uint32
		for _, rs := range r.ranks {
			if rs.status == Live {
				out = append(out, rs.id)
			}
		}
		r.liveIDs, r.liveOK = out, true
	}
	return r.liveIDs
}

// setStatus moves rs to st, the only way a rank's status changes, so that
// Live knows when to look again.
func (r *Roster) setStatus(rs *rankState, st Status) {
	if (rs.status == Live) != (st == Live) {
		r.liveOK = false
	}
	rs.status = st
	r.cfg.Changed(rs.id, st)
}

// Broadcast queues msg for every live rank.
func (r *Roster) Broadcast(msg proto.Message) {
	for _, id := range r.Live() {
		r.Send(id, msg)
	}
}

// Solo reports whether the cohort is down to one rank whose averager said
// a round alone leaves its arena as it is (Ready.solo_identity).
func (r *Roster) Solo() bool {
	live := r.Live()
	return len(live) == 1 && r.ranks[live[0]].ready.GetSoloIdentity()
}

// Heartbeat is the coordinator's proof of life to every connected rank: a
// rank that hears nothing past its liveness timeout shuts down. A rank's
// own silence is caught by its connection's read timeout (the heartbeat
// timeout), which ends in LinkDown.
func (r *Roster) Heartbeat() {
	r.hbSeq++
	msg := &wirepb.CoordinatorHeartbeat{Sequence: r.hbSeq}
	for _, rs := range r.ranks {
		if rs.status == Joined || rs.status == Ready || rs.status == Live {
			r.Send(rs.id, msg)
		}
	}
}

// Join takes an absent rank whose handshake succeeded into the forming
// cohort over conn and starts its sender.
func (r *Roster) Join(rank uint32, conn *wire.Conn) {
	rs := r.ranks[rank]
	rs.link = link.New(rs.id, conn)
	r.setStatus(rs, Joined)
	r.cfg.Start(rs.link)
	r.log.Info("rank joined", "rank", rs.id, "remote", conn.RemoteAddr().String())
}

// Ready checks a joined rank's Ready against rank 0's.
func (r *Roster) Ready(rank uint32, m *wirepb.Ready) {
	rs := r.ranks[rank]
	rs.ready = m
	r.setStatus(rs, Ready)
	ref := r.ranks[0]
	if rs.id == 0 {
		if m.GetSamples() == 0 || m.GetBatchSize() == 0 {
			r.refuse(rs, fmt.Sprintf("its trainer has %d samples and batch size %d", m.GetSamples(), m.GetBatchSize()))
			return
		}
		for _, o := range r.ranks[1:] {
			if o.status == Ready {
				r.verifyReady(o, m)
			}
		}
		return
	}
	if ref.status == Ready {
		r.verifyReady(rs, ref.ready)
	}
}

func (r *Roster) verifyReady(rs *rankState, ref *wirepb.Ready) {
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
func (r *Roster) refuse(rs *rankState, why string) {
	msg := fmt.Sprintf("rank %d: %s", rs.id, why)
	r.refusals = append(r.refusals, msg)
	r.log.Warn("refused a rank at formation", "rank", rs.id, "reason", why)
	r.dropUnformed(rs)
}

// AllReady reports whether every rank is Ready: the cohort can form.
func (r *Roster) AllReady() bool {
	for _, rs := range r.ranks {
		if rs.status != Ready {
			return false
		}
	}
	return true
}

// Form makes every rank a live member of the cohort.
func (r *Roster) Form() {
	for _, rs := range r.ranks {
		r.setStatus(rs, Live)
	}
}

// FormationError says how far formation got within timeout.
func (r *Roster) FormationError(timeout time.Duration) error {
	var joined, ready []uint32
	for _, rs := range r.ranks {
		if rs.status >= Joined {
			joined = append(joined, rs.id)
		}
		if rs.status >= Ready {
			ready = append(ready, rs.id)
		}
	}
	err := fmt.Errorf("coordinator: formation: %d/%d ranks ready within %v (joined %v, ready %v)",
		len(ready), r.cfg.World, timeout, joined, ready)
	if len(r.refusals) > 0 {
		err = fmt.Errorf("%w; refused: %s", err, r.refusals[len(r.refusals)-1])
	}
	return err
}

// dropUnformed forgets a rank that has not joined the formed cohort and
// frees its slot.
func (r *Roster) dropUnformed(rs *rankState) {
	if rs.link != nil {
		rs.link.Close()
		rs.link = nil
	}
	r.setStatus(rs, Absent)
	rs.ready = nil
	r.cfg.Slots.Release(rs.id)
	r.cfg.Dropped(rs.id)
}

// LinkDown handles a broken or silent link: before formation the rank
// may connect again; a member of the cohort is noted dead.
func (r *Roster) LinkDown(rank uint32, err error) {
	rs := r.ranks[rank]
	switch rs.status {
	case Exited, Dead:
		rs.link.Close()
		return
	case Joined, Ready:
		// Before formation a lost rank may simply connect again.
		r.log.Warn("rank left before the cohort formed", "rank", rs.id, "error", err)
		r.dropUnformed(rs)
		return
	}
	r.NoteDeath(rs.id, linkReason(err, r.cfg.HeartbeatTimeout))
}

// linkReason says why a link counts as dead.
func linkReason(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("silent for %v (heartbeat timeout)", timeout)
	case errors.Is(err, io.EOF):
		return "link closed without Exiting"
	}
	return fmt.Sprintf("link broken: %v", err)
}

// NoteDeath queues a death; the loop applies it (NextDeath) after the
// current handler, so a failure found in the middle of a broadcast never
// changes the set of ranks being iterated.
func (r *Roster) NoteDeath(rank uint32, reason string) {
	for _, d := range r.deathQ {
		if d.rank == rank {
			return
		}
	}
	r.deathQ = append(r.deathQ, deathNote{rank, reason})
}

// NextDeath takes the oldest death noted; false when none is.
func (r *Roster) NextDeath() (rank uint32, reason string, ok bool) {
	if len(r.deathQ) == 0 {
		return 0, "", false
	}
	d := r.deathQ[0]
	r.deathQ = r.deathQ[1:]
	return d.rank, d.reason, true
}

// Exiting records a rank's clean exit: one that has not joined the
// formed cohort is dropped, and a live one exits when the run is ending;
// true means a live rank left in the middle of the run, a departure for
// the coordinator to handle (like a death, but not counted as one).
func (r *Roster) Exiting(rank uint32, ending bool) (departs bool) {
	rs := r.ranks[rank]
	switch rs.status {
	case Joined, Ready:
		r.dropUnformed(rs)
		return false
	case Live:
	default:
		return false
	}
	if ending {
		r.setStatus(rs, Exited)
		r.log.Debug("rank exited", "rank", rs.id)
		return false
	}
	return true
}

// Lost handles a rank found dead (its link broke, or it fell silent, or
// it stopped reading): one that has not joined the formed cohort is
// dropped; true means a live rank is lost, for the coordinator to handle.
func (r *Roster) Lost(rank uint32, reason string) (departs bool) {
	rs := r.ranks[rank]
	switch rs.status {
	case Joined, Ready:
		r.log.Warn("rank lost before the cohort formed", "rank", rs.id, "reason", reason)
		r.dropUnformed(rs)
	case Live:
		return true
	}
	return false
}

// Leave takes a live rank out of the cohort (st is Exited or Dead) and
// closes its link.
func (r *Roster) Leave(rank uint32, st Status) {
	rs := r.ranks[rank]
	r.setStatus(rs, st)
	if rs.link != nil {
		rs.link.Close()
	}
}

// Close closes every link, which ends their readers and senders.
func (r *Roster) Close() {
	for _, rs := range r.ranks {
		if rs.link != nil {
			rs.link.Close()
		}
	}
}
