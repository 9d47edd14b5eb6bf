package record

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

// PublishEvery bounds how stale the published snapshot is: an event within
// it of the last snapshot is published when it has passed (PublishDue).
// The loop's heartbeat tick and the ranks' heartbeats publish too, so an
// idle spell's snapshot is at most about a second old, with no timer of
// its own: each wakes the coordinator, and on a machine whose cores all
// train each wake-up takes one from them.
const PublishEvery = 250 * time.Millisecond

// liveState is what the Recorder keeps for the snapshot and the live files.
type liveState struct {
	journal    *os.File // metrics.jsonl; nil when it could not be opened
	rounds     roundHistory
	epochs     epochCurve
	membership []status.Membership
	hist       status.Histogram
	deaths     uint64
	departures uint64
	// pluginRestarts counts the plugins ranks replaced.
	pluginRestarts uint64
	roundLoss      float64 // batch losses since the last round, summed
	roundLossN     uint64
	published      time.Time
	deferred       bool // Publish skipped a snapshot since the last
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

// OpenJournal opens metrics.jsonl for appending; a failure is logged, and
// the run goes on without it.
func (r *Recorder) OpenJournal() {
	path := filepath.Join(r.cfg.Out, MetricsFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		r.log.Warn("the live metrics file is not written", "path", path, "error", err)
		return
	}
	r.lv.journal = f
}

// writeJournal appends one line, in one write, so a reader tailing the
// file sees whole lines.
func (r *Recorder) writeJournal(v any) {
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

// CloseJournal closes metrics.jsonl.
func (r *Recorder) CloseJournal() {
	if r.lv.journal != nil {
		if err := r.lv.journal.Close(); err != nil {
			r.log.Warn("closing the live metrics file", "error", err)
		}
		r.lv.journal = nil
	}
}

// noteBatchLoss adds a Batch report's loss to the next round's.
func (r *Recorder) noteBatchLoss(loss float64, batches uint64) {
	if finite(loss) {
		r.lv.roundLoss += loss * float64(batches)
		r.lv.roundLossN += batches
	}
}

// noteRound records a completed round: curve, histogram, metrics.jsonl.
func (r *Recorder) noteRound(num, epoch uint64, d time.Duration, bytes float64) {
	p := status.RoundPoint{Round: num, Epoch: epoch, Seconds: d.Seconds(), Bytes: bytes, Time: time.Now().UTC()}
	if r.lv.roundLossN > 0 {
		l := safe(r.lv.roundLoss / float64(r.lv.roundLossN))
		p.Loss = &l
	}
	r.lv.roundLoss, r.lv.roundLossN = 0, 0
	r.lv.rounds.add(p)
	r.lv.hist.Observe(p.Seconds)
	r.writeJournal(journalRound{"round", p})
}

// NoteEpoch records the epoch just finished (EndEpoch's): metrics.jsonl,
// and summary.json rewritten as the run stands.
func (r *Recorder) NoteEpoch(s EpochSummary) {
	r.writeJournal(journalEpoch{"epoch", epochPoint(s)})
	head := r.summaryHead()
	if err := WriteJSONEpochs(filepath.Join(r.cfg.Out, SummaryFile), head, "epochs", r.epochs); err != nil {
		r.log.Warn("rewriting the run summary after the epoch failed", "epoch", s.Epoch, "error", err)
	}
	r.Publish(true)
}

// noteMembership records a membership event for the snapshot: a death, a
// departure, or a plugin a rank replaced (which is neither).
func (r *Recorder) noteMembership(ev MembershipEvent) {
	switch ev.Event {
	case "dead":
		r.lv.deaths++
	case EventPluginRestarted:
		r.lv.pluginRestarts++
	default:
		r.lv.departures++
	}
	r.lv.membership = append(r.lv.membership, status.Membership{
		Rank: ev.Rank, Event: ev.Event, Epoch: ev.Epoch, Reason: ev.Reason, Time: ev.Time.UTC(),
	})
	r.Publish(true)
}

func epochPoint(s EpochSummary) status.EpochPoint {
	return status.EpochPoint{Epoch: s.Epoch, Loss: s.Loss, EvalLoss: s.EvalLoss, Accuracy: s.Accuracy,
		Seconds: s.Seconds, Samples: s.Samples, Rounds: s.Rounds, Scalars: s.Scalars}
}

// Publish makes a new snapshot when forced or PublishEvery has passed.
// The curves share their arrays with the Recorder's: it only appends,
// beyond the length a snapshot sees, or starts a new array.
func (r *Recorder) Publish(force bool) {
	now := time.Now()
	if !force && now.Sub(r.lv.published) < PublishEvery {
		r.lv.deferred = true
		return
	}
	r.lv.published, r.lv.deferred = now, false
	run := r.cfg.Source.Now()
	s := &status.Snapshot{
		RunID:      r.cfg.RunID,
		Status:     run.Phase,
		Policy:     r.cfg.Policy,
		Trainer:    r.cfg.Trainer,
		Averager:   r.cfg.Averager,
		Time:       now.UTC(),
		Started:    r.cfg.Started.UTC(),
		World:      int(r.cfg.World),
		Live:       run.Live,
		Epoch:      run.Epoch + 1,
		Epochs:     r.cfg.Epochs,
		EpochTotal: run.EpochTotal,
		GlobalStep: r.cfg.Dispatch.GlobalStep(),
		Totals: status.Totals{
			Rounds:         r.rounds,
			RoundSeconds:   r.roundMS / 1000,
			BytesAveraged:  r.bytes,
			Deaths:         r.lv.deaths,
			Departures:     r.lv.departures,
			PluginRestarts: r.lv.pluginRestarts,
		},
		EpochCurve:   r.lv.epochs.points(),
		Membership:   r.lv.membership[:len(r.lv.membership):len(r.lv.membership)],
		RoundSeconds: r.lv.hist.Clone(),
	}
	s.Controller = r.cfg.Dispatch.LiveController()
	if run.Done {
		s.Status = run.Status
		if run.Err != nil {
			s.Error = run.Err.Error()
		}
	}
	s.RoundCurve = r.lv.rounds.last()
	if _, b := r.cfg.Bulk.Bulk(); float64(b) > s.Totals.BytesAveraged {
		s.Totals.BytesAveraged = float64(b) // the reduce server's count, where it served
	}
	if r.agg != nil {
		s.EpochDone = r.agg.prior.Samples + r.agg.trained
	}
	for id, rs := range r.ranks {
		s.Totals.Batches += rs.batches
		s.Totals.Samples += rs.samples
		s.Ranks = append(s.Ranks, status.Rank{
			Rank: uint32(id), State: rs.state, Reason: rs.reason,
			Epoch: rs.epoch + 1, Batches: rs.batches, Samples: rs.samples, BatchMS: safe(rs.batchMS),
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
	r.cfg.Publish(s)
}

// PublishDue says whether Publish skipped a snapshot since the last one,
// and how long until it may make one.
func (r *Recorder) PublishDue() (time.Duration, bool) {
	return max(0, PublishEvery-time.Since(r.lv.published)), r.lv.deferred
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

// WriteCurves draws OUT/curves.png from the page's epoch curve and its
// rounds' loss (in buckets of several rounds once they are many).
func (r *Recorder) WriteCurves() error {
	if err := status.WriteCurves(filepath.Join(r.cfg.Out, status.CurvesFile), r.lv.epochs.points(), r.lv.rounds.curve()); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	return nil
}
