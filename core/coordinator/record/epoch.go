package record

import (
	"maps"
	"math"
	"sort"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// EpochProgress is the running aggregate of an epoch in progress.
type EpochProgress struct {
	Samples uint64  `json:"samples"`
	Batches uint64  `json:"batches"`
	LossSum float64 `json:"loss_sum"` // Σ avg_loss·batches over Metrics with a finite loss
	// LossBatches are the batches LossSum covers.
	LossBatches uint64  `json:"loss_batches"`
	Seconds     float64 `json:"seconds"`
	// Scalars are the trainer scalars' sums so far, the earlier part's
	// included.
	Scalars map[string]ScalarSum `json:"scalars,omitempty"`
	// Ranks are each rank's share of Samples and Batches, so a resumed
	// epoch's shares still add up to its count.
	Ranks map[uint32]RankShare `json:"ranks,omitempty"`
}

// RankShare is one rank's part of an epoch's figures.
type RankShare struct {
	Samples uint64 `json:"samples"`
	Batches uint64 `json:"batches"`
}

// epochAgg accumulates one epoch's figures.
type epochAgg struct {
	epoch   uint64 // from 0
	started time.Time
	prior   EpochProgress
	samples uint64
	batches uint64
	lossSum float64
	// lossBatches are the batches lossSum covers: a report with a
	// non-finite loss is left out of the mean, not counted as zero.
	lossBatches uint64
	trained     uint64 // samples from Batch reports, for progress
	windows     uint64
	rounds      uint64
	roundMS     float64
	waitSum     float64
	waitN       uint64
	evalLoss    *float64
	accuracy    *float64
	perRank     map[uint32]*rankAgg
	scalars     epochScalars
}

type rankAgg struct {
	batches, samples, windows uint64
	waitSum                   float64
	waitN                     uint64
	trainMS                   float64 // the rank's own batch times, summed
	roundWaitMS               float64 // time rounds held its training
}

func (a *epochAgg) rank(r uint32) *rankAgg {
	ra := a.perRank[r]
	if ra == nil {
		ra = &rankAgg{}
		a.perRank[r] = ra
	}
	return ra
}

func (a *epochAgg) addWait(r uint32, d time.Duration) {
	ms := plugin.Milliseconds(d)
	if ms < 0 {
		ms = 0
	}
	a.waitSum += ms
	a.waitN++
	ra := a.rank(r)
	ra.waitSum += ms
	ra.waitN++
}

// StartEpoch opens the figures of epoch e (from 0); prior is what a
// resumed run's checkpoint says the epoch had done before.
func (r *Recorder) StartEpoch(e uint64, prior EpochProgress) {
	a := &epochAgg{epoch: e, started: time.Now(), prior: prior, perRank: map[uint32]*rankAgg{}}
	a.scalars.add(prior.Scalars)
	for id, sh := range prior.Ranks {
		ra := a.rank(id)
		ra.samples, ra.batches = sh.Samples, sh.Batches
	}
	r.agg = a
}

// Partial is what the epoch in progress has done so far, for a
// checkpoint; zero before the first epoch starts.
func (r *Recorder) Partial() EpochProgress {
	a := r.agg
	if a == nil {
		return EpochProgress{}
	}
	return EpochProgress{
		Samples:     a.prior.Samples + a.samples,
		Batches:     a.prior.Batches + a.batches,
		LossSum:     a.prior.LossSum + a.lossSum,
		LossBatches: a.prior.LossBatches + a.lossBatches,
		Seconds:     a.prior.Seconds + time.Since(a.started).Seconds(),
		Scalars:     maps.Clone(a.scalars.sums),
		Ranks:       a.shares(),
	}
}

// shares is each rank's share so far, the earlier part's included.
func (a *epochAgg) shares() map[uint32]RankShare {
	out := make(map[uint32]RankShare, len(a.perRank))
	for id, ra := range a.perRank {
		out[id] = RankShare{Samples: ra.samples, Batches: ra.batches}
	}
	return out
}

// Handed notes a plan handed to rank: a window (or async chunk) in which
// it had work.
func (r *Recorder) Handed(rank uint32) {
	if r.agg != nil {
		r.agg.rank(rank).windows++
	}
}

// WindowClosed records a closed window and how long each of its ranks
// waited between its last Metrics and the close.
func (r *Recorder) WindowClosed(waits map[uint32]time.Duration) {
	for id, d := range waits {
		r.agg.addWait(id, d)
	}
	r.agg.windows++
}

// Batch takes a live rank's Batch report; batchMS is the rank's smoothed
// batch time after it. due says a ProgressSamples report is due (at most
// every 100 ms), of done samples of the epoch, the latest batch loss
// being loss.
func (r *Recorder) Batch(rank uint32, m *wirepb.Batch, batches uint64, batchMS float64) (done uint64, loss *float64, due bool) {
	n := uint64(m.GetSamples())
	if l := m.GetBatchLoss(); finite(l) {
		r.lastLoss = &l
	}
	rr := &r.ranks[rank]
	rr.batches += batches
	rr.epoch = m.GetEpoch()
	rr.stepCount = m.GetStepCount()
	r.noteBatchLoss(m.GetBatchLoss(), batches)
	rr.samples += n
	rr.batchMS = batchMS
	if r.agg != nil {
		ra := r.agg.rank(rank)
		ra.batches += batches
		ra.samples += n
		if ms := m.GetBatchMs(); finite(ms) && ms > 0 {
			ra.trainMS += ms
		}
		r.agg.trained += n
		if now := time.Now(); now.Sub(r.lastProgress) >= 100*time.Millisecond {
			r.lastProgress = now
			return r.agg.prior.Samples + r.agg.trained, r.lastLoss, true
		}
	}
	return 0, nil, false
}

// Metrics takes the Metrics that closed one of rank's plans.
func (r *Recorder) Metrics(rank uint32, m *wirepb.Metrics) {
	if r.agg == nil {
		return
	}
	if v := m.GetRoundWaitMs(); finite(v) && v > 0 {
		r.agg.rank(rank).roundWaitMS += v
	}
	r.agg.samples += m.GetSamples()
	r.agg.batches += m.GetBatches()
	if l := m.GetAvgLoss(); finite(l) && m.GetBatches() > 0 {
		r.agg.lossSum += l * float64(m.GetBatches())
		r.agg.lossBatches += m.GetBatches()
	}
	r.noteScalars(rank, m)
}

// Unclosed adds to the epoch's figures what a departing rank's Batch
// reports say it trained of a plan no Metrics will close: those samples
// are not handed out again, so without this the epoch would come up short
// of its data set.
func (r *Recorder) Unclosed(t dispatch.Trained) {
	if r.agg == nil || t.Epoch != r.agg.epoch {
		return
	}
	r.agg.samples += t.Samples
	r.agg.batches += t.Batches
	r.agg.lossSum += t.LossSum
	r.agg.lossBatches += t.LossBatches
}

// Lost takes out of the epoch's figures, and out of rank's share, what
// the departed rank trained that no averaging round took from it: those
// samples are handed out again, and count when trained again. Unclosed
// must have counted the rank's open plans first.
func (r *Recorder) Lost(rank uint32, spans []dispatch.Span) {
	if r.agg == nil {
		return
	}
	ra := r.agg.rank(rank)
	for _, s := range spans {
		if s.Epoch != r.agg.epoch {
			continue
		}
		r.agg.samples -= min(s.Size, r.agg.samples)
		r.agg.batches -= min(s.Batches, r.agg.batches)
		r.agg.trained -= min(s.Size, r.agg.trained)
		ra.samples -= min(s.Size, ra.samples)
		ra.batches -= min(s.Batches, ra.batches)
	}
}

// Round records a completed averaging round: num, of epoch (from 1), took
// from Sync to the last SyncAck, acks are the live ranks'. Round 0
// (initial) counts in the run's totals only; windowed says the policy
// closes windows at the round (else each rank's time in the round beyond
// the fastest's is its wait at the sync).
func (r *Recorder) Round(num, epoch uint64, took time.Duration, acks map[uint32]*wirepb.SyncAck, initial, windowed bool) {
	ms := plugin.Milliseconds(took)
	var bytes float64
	minMS := math.Inf(1)
	for _, ack := range acks {
		bytes += float64(ack.GetBytesMoved())
		r.hostCopy += ack.GetHostCopyBytes()
		if v := ack.GetRoundMs(); finite(v) && v >= 0 {
			minMS = min(minMS, v)
		}
	}
	r.rounds++
	r.roundMS += ms
	r.bytes += bytes
	r.noteRound(num, epoch, took, bytes)
	if initial {
		return
	}
	r.agg.rounds++
	r.agg.roundMS += ms
	if !windowed && !math.IsInf(minMS, 1) {
		for id, ack := range acks {
			if v := ack.GetRoundMs(); finite(v) {
				r.agg.addWait(id, time.Duration((v-minMS)*float64(time.Millisecond)))
			}
		}
	}
}

// Evaluated records the epoch's evaluation by the eval role's rank: its
// loss and, when the trainer reports one, its accuracy.
func (r *Recorder) Evaluated(m *wirepb.EvalResult) {
	if l := m.GetLoss(); finite(l) {
		r.agg.evalLoss = &l
	}
	if m.Accuracy != nil && finite(m.GetAccuracy()) {
		a := m.GetAccuracy()
		r.agg.accuracy = &a
	}
}

// EndEpoch closes the epoch's figures and returns them; from here on a
// save resumes at the next epoch.
func (r *Recorder) EndEpoch() EpochSummary {
	a := r.agg
	s := EpochSummary{
		Epoch:    a.epoch + 1,
		EvalLoss: a.evalLoss,
		Accuracy: a.accuracy,
		Seconds:  a.prior.Seconds + time.Since(a.started).Seconds(),
		Samples:  a.prior.Samples + a.samples,
		Windows:  a.windows,
		Rounds:   a.rounds,
		Scalars:  a.scalars.means(),
	}
	if b := a.prior.LossBatches + a.lossBatches; b > 0 {
		s.Loss = safe((a.prior.LossSum + a.lossSum) / float64(b))
	}
	if a.rounds > 0 {
		s.MeanRoundMS = safe(a.roundMS / float64(a.rounds))
	}
	if a.waitN > 0 {
		s.WaitAtSyncMS = safe(a.waitSum / float64(a.waitN))
	}
	ids := make([]uint32, 0, len(a.perRank))
	for id := range a.perRank {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		ra := a.perRank[id]
		er := EpochRank{Rank: id, Batches: ra.batches, Samples: ra.samples, Windows: ra.windows, TrainMS: safe(ra.trainMS),
			RoundWaitMS: safe(ra.roundWaitMS)}
		if ra.windows > 0 {
			er.BatchesPerWindow = float64(ra.batches) / float64(ra.windows)
		}
		if ra.waitN > 0 {
			er.WaitAtSyncMS = safe(ra.waitSum / float64(ra.waitN))
		}
		s.Ranks = append(s.Ranks, er)
	}
	if err := r.epochs.add(s); err != nil {
		r.log.Warn("keeping the finished epochs", "error", err)
	}
	r.lv.epochs.add(epochPoint(s))
	r.log.Info("epoch finished", "epoch", a.epoch+1, "loss", s.Loss, "seconds", s.Seconds,
		"samples", s.Samples, "rounds", s.Rounds, "wait_at_sync_ms", s.WaitAtSyncMS)
	return s
}
