package worker

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
)

// batchMerger turns a plan's batch reports into Batch frames. This is the
// one place the control channel's frames merge: the trainer, in process or
// behind the plugin adapter, reports each batch. A plan that lets reports
// merge (plugin.Plan.ReportMerge) sends one frame per interval and one
// before its Metrics, counting the batches it holds (samples and times are
// sums, the loss a mean); any other plan sends one frame per batch. A
// plugin that merged the reports itself delivers an interval's worth in
// one group, which goes out as one frame at once rather than wait for an
// interval of the worker's own.
type batchMerger struct {
	w        *worker
	plan     plugin.Plan
	merged   *wirepb.Batch
	lastSent time.Time
}

func newBatchMerger(w *worker, p plugin.Plan) *batchMerger {
	return &batchMerger{w: w, plan: p, lastSent: time.Now()}
}

// add counts b into the frame being built.
func (m *batchMerger) add(b plugin.BatchReport) {
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
}

// groupDone sends the frame after a group of n reports that arrived
// together, unless the plan merges and the group is one report within the
// interval.
func (m *batchMerger) groupDone(n int) error {
	if every := m.plan.ReportMerge; every > 0 && n <= 1 && time.Since(m.lastSent) < every {
		return nil
	}
	return m.flush(m.w.connCtx)
}

// flush sends the frame being built, if any. A frame ctx stopped is kept
// for the next flush: the plan's last flush, under the run's context,
// sends it, so the coordinator learns of every batch the model holds
// before a stop's save.
func (m *batchMerger) flush(ctx context.Context) error {
	if m.merged == nil {
		return nil
	}
	f := proto.Clone(m.merged).(*wirepb.Batch)
	if f.Batches > 1 {
		f.BatchLoss /= float64(f.Batches)
	}
	f.SyncDivergence = m.w.divergence
	if err := m.w.send(ctx, f); err != nil {
		return err
	}
	m.merged, m.lastSent, m.w.divergence = nil, time.Now(), nil
	return nil
}

// planStats sums one plan's batch reports for its Metrics.
type planStats struct {
	batches, samples  uint64
	loss              float64
	computeMS, dataMS float64
	scalars           scalarSums
}

// add counts b. It returns how long b's step waited for a round running
// beside it (BatchReport.RoundWaitMS), when b says so plausibly.
func (st *planStats) add(b plugin.BatchReport) (roundWait time.Duration) {
	st.batches++
	st.samples += uint64(b.Samples)
	st.loss += b.Loss
	st.dataMS += b.DataMS
	st.computeMS += max(b.BatchMS-b.DataMS, 0)
	st.scalars.add(b.Scalars)
	if v := b.RoundWaitMS; v > 0 && v <= b.BatchMS && !math.IsInf(b.BatchMS, 0) {
		return time.Duration(v * float64(time.Millisecond))
	}
	return 0
}

// metrics is plan p's Metrics as far as its reports tell (the rank, the
// time rounds held it and the resource sample are the caller's).
func (st *planStats) metrics(p plugin.Plan, elapsed time.Duration) *wirepb.Metrics {
	m := &wirepb.Metrics{
		Epoch:           p.Epoch,
		Batches:         st.batches,
		Samples:         st.samples,
		EpochMs:         plugin.Milliseconds(elapsed),
		ComputeMs:       st.computeMS,
		DataMs:          st.dataMS,
		PartitionOffset: p.PartitionOffset,
		PartitionSize:   p.PartitionSize,
		Scalars:         st.scalars.sums,
	}
	if st.batches > 0 {
		m.AvgLoss = st.loss / float64(st.batches)
	}
	return m
}

// warnDropped says, once per plan, what scalars were dropped and why.
func (st *planStats) warnDropped(log hclog.Logger, p plugin.Plan) {
	if sc := st.scalars; sc.badNames+sc.overLimit > 0 {
		log.Warn("dropped trainer scalars: a name is 1 to 64 bytes of [a-z0-9_./-], and a plan keeps its first names up to the limit",
			"epoch", p.Epoch, "offset", p.PartitionOffset, "invalid_name", sc.badNames, "over_limit", sc.overLimit,
			"limit", plugin.MaxScalars, "example", fmt.Sprintf("%q", sc.example))
	}
}
