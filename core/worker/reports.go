package worker

import (
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// batchMerger turns a plan's batch reports into Batch frames. This is the
// one place reports merge: the trainer, in process or behind the plugin
// adapter, reports each batch. A plan that lets reports merge
// (reportEvery > 0) sends one frame per interval and one before its
// Metrics, counting the batches it holds (samples and times are sums, the
// loss a mean); any other plan sends one frame per batch.
type batchMerger struct {
	w           *worker
	plan        plugin.Plan
	reportEvery time.Duration
	merged      *wirepb.Batch
	lastSent    time.Time
}

func newBatchMerger(w *worker, p plugin.Plan, reportEvery time.Duration) *batchMerger {
	return &batchMerger{w: w, plan: p, reportEvery: reportEvery, lastSent: time.Now()}
}

func (m *batchMerger) add(b plugin.BatchReport) error {
	if m.merged == nil {
		m.merged = &wirepb.Batch{Rank: m.w.o.Rank, Epoch: m.plan.Epoch, PartitionOffset: m.plan.PartitionOffset, PartitionSize: m.plan.PartitionSize}
	}
	f := m.merged
	f.Batches++
	f.BatchMs += b.BatchMS
	f.DataMs += b.DataMS
	f.BatchLoss += b.Loss
	f.Samples += b.Samples
	f.StepCount = b.StepCount
	if b.ParamNorm != nil {
		f.ParamNorm = b.ParamNorm
	}
	if m.reportEvery > 0 && time.Since(m.lastSent) < m.reportEvery {
		return nil
	}
	return m.flush()
}

// flush sends the frame being built, if any.
func (m *batchMerger) flush() error {
	f := m.merged
	if f == nil {
		return nil
	}
	m.merged, m.lastSent = nil, time.Now()
	if f.Batches > 1 {
		f.BatchLoss /= float64(f.Batches)
	}
	if m.w.divergence != nil {
		f.SyncDivergence, m.w.divergence = m.w.divergence, nil
	}
	return m.w.send(m.w.stopCtx, f)
}
