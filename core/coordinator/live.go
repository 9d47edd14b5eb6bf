package coordinator

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cohortdl/cohort/core/status"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// MetricsFile is the live record of rounds and epochs in the run's out
// directory: one JSON object a line, appended as they finish.
const MetricsFile = "metrics.jsonl"

// StatusRunning is a summary.json's status while the run goes on: it is
// rewritten after every epoch.
const StatusRunning = "running"

// RankLive is a rank's state in a summary written while it trains.
const RankLive = "live"

// publishEvery bounds how stale the published snapshot is while events
// keep the loop busy; the loop's ticker covers idle spells.
const publishEvery = 250 * time.Millisecond

// Status is the run's latest published snapshot, for the status server;
// nil before Run starts. It may be called from any goroutine: the loop
// publishes a new immutable snapshot and never waits on a reader.
func (c *Coordinator) Status() *status.Snapshot { return c.snapshot.Load() }

// liveState is what the loop keeps for the snapshot and the live files.
type liveState struct {
	journal    *os.File // metrics.jsonl; nil when it could not be opened
	rounds     []status.RoundPoint
	epochs     []status.EpochPoint
	membership []status.Membership
	hist       status.Histogram
	deaths     uint64
	departures uint64
	// pluginRestarts counts the plugins ranks replaced.
	pluginRestarts uint64
	roundLoss      float64 // batch losses since the last round, summed
	roundLossN     uint64
	published      time.Time
	rate           float64
	rateAt         time.Time
	rateSamples    uint64
}

// journalRound and journalEpoch are metrics.jsonl's two kinds of line.
type journalRound struct {
	Kind string `json:"kind"` // "round"
	status.RoundPoint
}

type journalEpoch struct {
	Kind string `json:"kind"` // "epoch"
	status.EpochPoint
}

func (r *runner) openJournal() {
	path := filepath.Join(r.c.out, MetricsFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		r.log.Warn("the live metrics file is not written", "path", path, "error", err)
		return
	}
	r.lv.journal = f
}

// writeJournal appends one line, in one write, so a reader tailing the
// file sees whole lines.
func (r *runner) writeJournal(v any) {
	if r.lv.journal == nil {
		return
	}
	b, err := json.Marshal(v)
	if err == nil {
		_, err = r.lv.journal.Write(append(b, '\n'))
	}
	if err != nil {
		r.log.Warn("writing the live metrics file failed; it stops here", "error", err)
		r.lv.journal.Close()
		r.lv.journal = nil
	}
}

func (r *runner) closeJournal() {
	if r.lv.journal != nil {
		if err := r.lv.journal.Close(); err != nil {
			r.log.Warn("closing the live metrics file", "error", err)
		}
		r.lv.journal = nil
	}
}

// noteBatchLoss adds a Batch report's loss to the next round's.
func (r *runner) noteBatchLoss(loss float64, batches uint64) {
	if finite(loss) {
		r.lv.roundLoss += loss * float64(batches)
		r.lv.roundLossN += batches
	}
}

// noteRound records a completed round: curve, histogram, metrics.jsonl.
func (r *runner) noteRound(num uint64, d time.Duration, bytes float64) {
	p := status.RoundPoint{Round: num, Epoch: r.epoch + 1, Seconds: d.Seconds(), Bytes: bytes, Time: time.Now().UTC()}
	if r.lv.roundLossN > 0 {
		l := safe(r.lv.roundLoss / float64(r.lv.roundLossN))
		p.Loss = &l
	}
	r.lv.roundLoss, r.lv.roundLossN = 0, 0
	r.lv.rounds = append(r.lv.rounds, p)
	r.lv.hist.Observe(p.Seconds)
	r.writeJournal(journalRound{"round", p})
}

// noteEpoch records the epoch just finished: metrics.jsonl, and
// summary.json rewritten as the run stands.
func (r *runner) noteEpoch(s EpochSummary) {
	r.writeJournal(journalEpoch{"epoch", epochPoint(s)})
	sum := r.summary()
	if err := writeJSONAtomic(filepath.Join(r.c.out, SummaryFile), sum); err != nil {
		r.log.Warn("rewriting the run summary after the epoch failed", "epoch", s.Epoch, "error", err)
	}
	r.publish(true)
}

// noteMembership records a membership event for the snapshot: a death, a
// departure, or a plugin a rank replaced (which is neither).
func (r *runner) noteMembership(ev MembershipEvent) {
	switch ev.Event {
	case "dead":
		r.lv.deaths++
	case eventPluginRestarted:
		r.lv.pluginRestarts++
	default:
		r.lv.departures++
	}
	r.lv.membership = append(r.lv.membership, status.Membership{
		Rank: ev.Rank, Event: ev.Event, Epoch: ev.Epoch, Reason: ev.Reason, Time: ev.Time.UTC(),
	})
	r.publish(true)
}

func epochPoint(s EpochSummary) status.EpochPoint {
	return status.EpochPoint{Epoch: s.Epoch, Loss: s.Loss, EvalLoss: s.EvalLoss, Accuracy: s.Accuracy,
		Seconds: s.Seconds, Samples: s.Samples, Rounds: s.Rounds, Scalars: s.Scalars}
}

var rankStates = [...]string{stAbsent: "absent", stJoined: "joined", stReady: "ready", stLive: RankLive, stExited: RankExited, stDead: RankDead}

// publish makes a new snapshot when forced or publishEvery has passed.
// The curves share their arrays with the loop's: the loop only appends,
// beyond the length a snapshot sees.
func (r *runner) publish(force bool) {
	now := time.Now()
	if !force && now.Sub(r.lv.published) < publishEvery {
		return
	}
	r.lv.published = now
	for len(r.lv.epochs) < len(r.finished) {
		r.lv.epochs = append(r.lv.epochs, epochPoint(r.finished[len(r.lv.epochs)]))
	}
	s := &status.Snapshot{
		RunID:      r.c.runID,
		Status:     r.phase.String(),
		Policy:     string(r.policy),
		Trainer:    r.cfg.Trainer.Name,
		Averager:   r.cfg.Averager.Name,
		Time:       now.UTC(),
		Started:    r.started.UTC(),
		World:      int(r.world),
		Live:       len(r.live()),
		Epoch:      r.epoch + 1,
		Epochs:     r.cfg.Run.Epochs,
		EpochTotal: r.pickSpace,
		GlobalStep: r.disp.GlobalStep(),
		Totals: status.Totals{
			Rounds:         r.rounds,
			RoundSeconds:   r.roundMS / 1000,
			BytesAveraged:  r.bytes,
			Deaths:         r.lv.deaths,
			Departures:     r.lv.departures,
			PluginRestarts: r.lv.pluginRestarts,
		},
		EpochCurve:   r.lv.epochs[:len(r.lv.epochs):len(r.lv.epochs)],
		Membership:   r.lv.membership[:len(r.lv.membership):len(r.lv.membership)],
		RoundSeconds: r.lv.hist.Clone(),
	}
	s.Controller = r.disp.LiveController()
	if r.phase == phDone {
		s.Status = r.status
		if r.err != nil {
			s.Error = r.err.Error()
		}
	}
	rounds := r.lv.rounds[max(0, len(r.lv.rounds)-status.MaxRounds):]
	s.RoundCurve = rounds[:len(rounds):len(rounds)]
	if _, b := r.c.meetings.Bulk(); float64(b) > s.Totals.BytesAveraged {
		s.Totals.BytesAveraged = float64(b) // the reduce server's count, where it served
	}
	if r.agg != nil {
		s.EpochDone = r.agg.prior.Samples + r.agg.trained
	}
	for _, rs := range r.ranks {
		s.Totals.Batches += rs.batches
		s.Totals.Samples += rs.samples
		s.Ranks = append(s.Ranks, status.Rank{
			Rank: rs.id, State: rankStates[rs.status], Reason: rs.reason,
			Epoch: rs.epoch + 1, Batches: rs.batches, Samples: rs.samples, BatchMS: safe(r.disp.BatchMS(rs.id)),
			LastHeard: rs.lastHeard.UTC(), Resources: resourcesOf(rs.res), PluginRestarts: rs.pluginRestarts,
		})
	}
	if dt := now.Sub(r.lv.rateAt); r.lv.rateAt.IsZero() || dt >= time.Second {
		if !r.lv.rateAt.IsZero() {
			r.lv.rate = float64(s.Totals.Samples-r.lv.rateSamples) / dt.Seconds()
		}
		r.lv.rateAt, r.lv.rateSamples = now, s.Totals.Samples
	}
	s.SamplesPerSecond = r.lv.rate
	r.c.snapshot.Store(s)
}

// resourcesOf copies a rank's ResourceSample into the snapshot's terms.
func resourcesOf(m *wirepb.ResourceSample) *status.Resources {
	if m == nil {
		return nil
	}
	out := &status.Resources{
		Time:           time.Unix(0, m.GetUnixNanos()).UTC(),
		HostCPUPercent: m.CpuPercent,
		HostRAMUsed:    m.RamUsedBytes,
		HostRAMTotal:   m.RamTotalBytes,
		Processes:      []status.Process{},
		GPUs:           []status.GPU{},
	}
	for _, p := range m.GetProcesses() {
		out.Processes = append(out.Processes, status.Process{Role: p.GetRole(), Name: p.GetName(), PID: p.GetPid(),
			CPUPercent: p.CpuPercent, RSS: p.RssBytes})
	}
	for _, g := range m.GetGpus() {
		out.GPUs = append(out.GPUs, status.GPU{Index: g.GetIndex(), Name: g.GetName(), UtilPercent: g.UtilPercent,
			MemUsed: g.MemoryUsedBytes, MemTotal: g.MemoryTotalBytes})
	}
	return out
}

// writeCurves draws OUT/curves.png from every epoch and round of the run.
func (r *runner) writeCurves() error {
	if err := status.WriteCurves(filepath.Join(r.c.out, status.CurvesFile), r.lv.epochs, r.lv.rounds); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	return nil
}
