package coordinator

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// A coordinator that comes back: one started with --resume on a run whose
// coordinator died (its consensus file is still there) takes back the
// ranks that outlived it. The consensus file says what the cohort's last
// consensus holds; each rank that kept its model says, in Ready.kept, the
// last round that succeeded on it and what it trained since it published
// into that round. The ranks then finish the window they were training
// (continueWindow), or a first round starts every rank from those models;
// either way the epoch goes on from that consensus, each sample trained
// once (docs/protocol.md, "A coordinator that comes back").

// openComeback reads the consensus file of the run resume names, and
// keeps it when the run's coordinator died after its last checkpoint: the
// file's base is the run's last complete checkpoint (the one resume names,
// if it names one) and every rank was live at the consensus. false: resume
// from a checkpoint, as for any resume.
func (c *Coordinator) openComeback(resume string) (bool, error) {
	dir := checkpoint.CheckpointsDirOf(resume)
	cons, err := checkpoint.ReadConsensus(dir)
	if err != nil || cons == nil {
		return false, err
	}
	last, _ := checkpoint.LastCheckpoint(dir)
	named := ""
	if _, err := os.Stat(filepath.Join(resume, checkpoint.MetaFile)); err == nil {
		named, _ = filepath.Abs(resume)
	}
	switch {
	case cons.Base != last, named != "" && named != cons.Base:
		c.log.Info("the consensus file is older than the checkpoint resumed from; resuming from the checkpoint", "base", cons.Base, "checkpoint", last)
		return false, nil
	case cons.Last.Seed != c.cfg.Run.Seed || cons.Last.WorldSize != uint32(c.cfg.Run.Ranks):
		return false, fmt.Errorf("the consensus file in %s was written with seed %d and %d ranks, the config has seed %d and %d",
			dir, cons.Last.Seed, cons.Last.WorldSize, c.cfg.Run.Seed, c.cfg.Run.Ranks)
	case len(cons.Live) != c.cfg.Run.Ranks:
		c.log.Info("the cohort had lost ranks at its last consensus; resuming from the checkpoint", "live", cons.Live)
		return false, nil
	}
	c.comeback = cons
	c.runID = cons.Last.RunID
	if cons.Base != "" {
		c.resume = cons.Base
		if c.meta, err = checkpoint.ReadMeta(cons.Base); err != nil {
			return false, err
		}
	}
	c.log.Info("coming back: the ranks that kept their models continue from the last consensus",
		"round", cons.Round, "epoch", cons.Last.Epoch+1, "checkpoint", cons.Base)
	return true, nil
}

// comebackPlan is how the first round of a coordinator that came back
// starts the cohort: from the models of the ranks that kept the
// consensus (holders), each holding it plus its own held work.
type comebackPlan struct {
	// round is the consensus the holders kept.
	round uint64
	// state is what the holders' consensus holds; nil: no rank kept it,
	// and the run resumes from the checkpoint (c.meta).
	state *checkpoint.Meta
	// holders' held spans, by rank.
	held map[uint32][]dispatch.Span
	// root is the lowest holder: a broadcast starts every rank from it.
	root uint32
	// all: every rank holds the same consensus, so the first round may
	// average them (each one's held work then reaches the model).
	all bool
	// averaged: the first round averaged on some rank.
	averaged bool
	// continued: there is no first round; the ranks finish the window
	// they were training (continueWindow).
	continued bool
}

// planComeback decides, once every rank is Ready, which models the first
// round starts from (planComebackOf).
func (r *runner) planComeback() *comebackPlan {
	live := r.ranks.Live()
	kept := make(map[uint32]*wirepb.Kept, len(live))
	for _, id := range live {
		kept[id] = r.ranks.ReadyOf(id).GetKept()
	}
	return planComebackOf(r.c.comeback, r.c.runID, live, kept, r.log)
}

// planComebackOf picks the holders among the live ranks by what each kept
// (nil: it started fresh and loaded the checkpoint). Ranks that kept a
// model of a round the file knows hold it. The pending round wins when
// any rank holds it: it succeeded there, so its average holds everything
// the last completed round does plus every rank's work published into it,
// and a rank whose copy of it was cut off (it kept the round before) has
// nothing beyond that under a windowed policy. Starting from the older
// round would train the pending round's work again. When no rank kept a
// known round, the run resumes from the checkpoint, broadcast from the
// lowest fresh rank.
func planComebackOf(cons *checkpoint.Consensus, runID string, live []uint32, kept map[uint32]*wirepb.Kept, log hclog.Logger) *comebackPlan {
	byRound := map[uint64][]uint32{}
	var fresh []uint32
	for _, id := range live {
		k := kept[id]
		if k == nil || k.GetRunId() != runID {
			fresh = append(fresh, id)
			continue
		}
		if _, ok := cons.State(k.GetLastRound()); ok {
			byRound[k.GetLastRound()] = append(byRound[k.GetLastRound()], id)
		} else {
			log.Warn("a rank kept a model of a round the consensus file does not know; it takes the others'", "rank", id,
				"last_round", k.GetLastRound(), "consensus_round", cons.Round)
		}
	}
	var round uint64
	var holders []uint32
	if cons.Pending != nil {
		round, holders = cons.Pending.Round, byRound[cons.Pending.Round]
	}
	if len(holders) == 0 {
		round, holders = cons.Round, byRound[cons.Round]
	}
	if len(holders) == 0 {
		root := uint32(0)
		if len(fresh) > 0 {
			root = fresh[0]
		}
		log.Warn("no rank kept the consensus; resuming from the checkpoint", "checkpoint", cons.Base, "root", root)
		return &comebackPlan{root: root}
	}
	state, _ := cons.State(round)
	p := &comebackPlan{round: round, state: state, held: map[uint32][]dispatch.Span{}, root: slices.Min(holders),
		all: len(holders) == len(live)}
	for _, id := range holders {
		p.held[id] = nil // a holder, whatever it trained since
		for _, s := range kept[id].GetHeld() {
			p.held[id] = append(p.held[id], dispatch.Span{Epoch: s.GetEpoch(),
				Range: dispatch.Range{Offset: s.GetOffset(), Size: s.GetSize()}, Batches: s.GetBatches()})
		}
	}
	log.Info("the ranks kept the consensus", "round", round, "holders", holders, "root", p.root, "average_first", p.all)
	return p
}

// continueWindow starts the cohort again without a round, when every
// rank kept the same consensus and its work since is the start of the
// plan the window after that consensus gives it (the sync policy hands
// windows out the same way again): each rank is handed the rest of that
// plan, and the window's round averages it all, as it would have without
// the comeback. The run then follows the path it was on: the same rounds
// at the same batches, the same plans. false: no rank was handed anything
// and the first round must bring the kept work in (firstRound).
func (r *runner) continueWindow() bool {
	p, m, live := r.cb, r.cb.state, r.ranks.Live()
	if !p.all || m == nil || m.Epoch >= uint64(r.cfg.Run.Epochs) || r.policy != config.PolicySync {
		return false
	}
	if !r.disp.Resume(dispatch.Resumed{Epoch: m.Epoch, Remaining: m.Remaining, Pool: m.Pool, GlobalStep: m.GlobalStep}, live) {
		// Nothing is dispatched before the first round: it resumes the
		// epoch again once it completed.
		r.disp.EndEpoch()
		return false
	}
	r.disp.RestoreController(m.Controller, m.ControllerWindow)
	// The consensus's state: what a save before the window's round
	// resumes from, the kept work still to train.
	snap := checkpoint.Progress{Snapshot: r.disp.Snapshot(live), Partial: m.Partial}
	plans, ok := r.disp.ContinueWindow(live, p.held)
	if !ok {
		r.disp.EndEpoch()
		return false
	}
	p.continued = true
	r.rep.Resumed(m.Rounds, slices.Clone(m.Finished))
	r.epoch = m.Epoch
	// The kept work counts in the epoch's figures as its ranks'.
	counted := *m
	counted.Remaining = slices.Clone(m.Remaining)
	for id, spans := range p.held {
		counted.Holds(id, spans)
	}
	r.rep.StartEpoch(m.Epoch, counted.Partial)
	r.snap = snap
	r.consRound = p.round
	p.keep(r.c.out, r.roundSeq, r.log)
	r.deliver(live, plans, nil)
	r.log.Info("the ranks finish the window they were training", "consensus", p.round, "epoch", m.Epoch+1,
		"plans", len(plans), "samples_left", r.disp.Remaining())
	return true
}

// firstRound is the first round's mode and root: an average of the
// holders when every rank is one, else a broadcast from the root.
func (p *comebackPlan) firstRound() (wirepb.SyncMode, uint32) {
	if p.all {
		return wirepb.SyncMode_SYNC_MODE_AVERAGE, p.root
	}
	return wirepb.SyncMode_SYNC_MODE_BROADCAST, p.root
}

// resumed is the state the run goes on from once the first round
// completed: the consensus plus what reached the model with that round
// (every holder's held work if it averaged, else the root's), which then
// is neither remaining nor trained again.
func (p *comebackPlan) resumed(world uint32) *checkpoint.Meta {
	m := *p.state
	m.Remaining = slices.Clone(m.Remaining)
	var batches uint64
	for id, spans := range p.held {
		if !p.averaged && id != p.root {
			continue
		}
		m.Holds(id, spans)
		for _, s := range spans {
			if s.Epoch == m.Epoch {
				batches += s.Batches
			}
		}
	}
	m.GlobalStep += batches / uint64(world)
	return &m
}

// keep writes the comeback's record into the run's out directory: which
// kept work the first round (num) took into the model, and which it
// replaced and is trained again; after continueWindow, num is the
// window's round, which takes it all.
func (p *comebackPlan) keep(out string, num uint64, log hclog.Logger) {
	rec := record.ComebackRecord{Consensus: p.round, Round: num, Mode: "broadcast", Root: p.root,
		Reached: map[uint32][]dispatch.Span{}, Retrained: map[uint32][]dispatch.Span{}}
	switch {
	case p.continued:
		rec.Mode = "continue"
	case p.averaged:
		rec.Mode = "average"
	}
	for id, spans := range p.held {
		rec.Holders = append(rec.Holders, id)
		if p.continued || p.averaged || id == p.root {
			rec.Reached[id] = spans
		} else {
			rec.Retrained[id] = spans
		}
	}
	slices.Sort(rec.Holders)
	path := filepath.Join(out, record.ComebacksDir, fmt.Sprintf("comeback-%06d.json", num))
	err := os.MkdirAll(filepath.Dir(path), 0o755)
	if err == nil {
		err = record.WriteJSON(path, &rec)
	}
	if err != nil {
		log.Warn("the comeback's record could not be written", "error", err)
	}
}

// consensusNow writes the consensus file: the state as of the last
// completed round, and pending, the one a round in flight leaves. A
// failed write costs only a comeback; the run goes on.
func (r *runner) consensusNow(pending *checkpoint.ConsensusAt) {
	if r.phase == phDone || r.phase == phForming {
		return
	}
	last := checkpoint.ConsensusAt{Round: r.consRound, Progress: r.snap, Totals: r.totals()}
	if err := r.c.ckpts.WriteConsensus(last, pending, r.ranks.Live(), r.roundSeq); err != nil && !r.consWarned {
		r.consWarned = true
		r.log.Warn("a coordinator restarted now could not take the ranks back", "error", err)
	}
}

// pendingConsensus is the state round num leaves, taken as it is issued:
// under a windowed policy with no rank holding plans, every rank has
// published all it trained, so the round's consensus is known now.
func (r *runner) pendingConsensus(num uint64) *checkpoint.ConsensusAt {
	live := r.ranks.Live()
	if !r.disp.Windowed() || r.disp.Busy(live) || !r.disp.Training() {
		return nil
	}
	t := r.totals()
	t.Rounds++
	return &checkpoint.ConsensusAt{Round: num, Progress: r.progressNow(), Totals: t}
}

// totals is what a checkpoint's meta.json takes from the run now.
func (r *runner) totals() checkpoint.Totals {
	return checkpoint.Totals{
		PickSpace: r.pickSpace, BatchSize: r.batch, Rounds: r.rep.RoundsTotal(), GlobalStep: r.disp.GlobalStep(),
		Finished: r.rep.Finished(), Cadence: r.disp.CadenceState(),
	}
}
