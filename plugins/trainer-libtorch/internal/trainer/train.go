package trainer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/dataset"
	"github.com/cohortdl/cohort/plugins/trainer-libtorch/internal/shim"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Train runs the plan's picks (plugin.Picker; pick p trains sample
// p % samples) in batches of batch_size, the last one possibly short,
// reporting every batch: after it, or after its run of steps where the
// plan lets reports merge (trainRuns). ctx is checked between batches.
func (t *Trainer) Train(ctx context.Context, plan plugin.Plan, report func(plugin.BatchReport) error) error {
	if !t.trainMu.TryLock() {
		return errors.New("libtorch trainer: Train is already running")
	}
	defer t.trainMu.Unlock()
	// The whole batch loop runs on the trainer's own OS thread, the same
	// one for every Train of its lifetime: libtorch and OpenBLAS keep state
	// per thread, and a thread that changes at every call (each short Train
	// of a sync_every window) starts cold.
	var err error
	if rerr := t.thread.Run(func() { err = t.trainOnThread(ctx, plan, report) }); rerr != nil {
		return errors.New("libtorch trainer: Train after Shutdown")
	}
	return err
}

// batchBuf is one gathered batch: features, and labels or targets. err is
// its gather's failure; ebuf the shim's message buffer for it, one per
// batch buffer since the prefetching goroutine gathers beside a step.
type batchBuf struct {
	idx  []uint64
	x    []float32
	y    []int64
	tg   []float32
	n    int
	err  error
	ebuf []byte
}

func newBatchBuf(d *dataset.Set, batch int) *batchBuf {
	b := &batchBuf{idx: make([]uint64, batch), x: make([]float32, batch*d.Features()), ebuf: make([]byte, shim.ErrBufLen)}
	if d.Labels() != nil {
		b.y = make([]int64, batch)
	} else {
		b.tg = make([]float32, batch*d.Width())
	}
	return b
}

// shimData is d's arrays as the shim reads them. Keep d reachable (its
// KeepMapped) while the shim reads them.
func shimData(d *dataset.Set) *shim.Data {
	u8, f32, labels, targets := d.Arrays()
	return &shim.Data{N: d.N(), Features: d.Features(), Width: d.Width(), U8: u8, F32: f32, Labels: labels, Targets: targets}
}

// fill gathers the samples picks name (modulo the set's size) into b,
// through the shim's gather (sd is d's shimData): the one a run of steps
// uses, whose byte scaling and fetching ahead make a batch of bytes no
// dearer to gather than one of floats, and either cheaper than row by row.
func (b *batchBuf) fill(s *shim.Shim, d *dataset.Set, sd *shim.Data, picks []uint64) {
	n := len(picks)
	b.n = n
	for i, p := range picks {
		b.idx[i] = p % uint64(d.N())
	}
	y, tg := b.targets(d.Width())
	b.err = s.Gather(sd, b.idx[:n], b.x[:n*d.Features()], y, tg, b.ebuf)
	d.KeepMapped()
}

// targets are the batch's labels or, for a regression set, its width-wide
// targets; the other is nil.
func (b *batchBuf) targets(width int) ([]int64, []float32) {
	if b.y != nil {
		return b.y[:b.n], nil
	}
	return nil, b.tg[:b.n*width]
}

// trainOnThread is Train's batch loop, on t.thread. With a core to spare
// (t.prefetch), a goroutine gathers the next batch while this one trains,
// as a data loader prefetches: the gather reads random rows of the
// training set, and its cache misses would otherwise sit on the training
// thread between every two steps.
func (t *Trainer) trainOnThread(ctx context.Context, plan plugin.Plan, report func(plugin.BatchReport) error) error {
	t.mu.Lock()
	if t.model == nil {
		t.mu.Unlock()
		return errors.New("libtorch trainer: Train before Configure")
	}
	data, bufs, batch, gen, prefetch := t.train, t.bufs, uint64(t.s.BatchSize), t.gen, t.prefetch
	sd := shimData(data)
	onCPU := t.s.Device == "cpu"
	if plan.GlobalStep != 0 {
		t.schedStep = plan.GlobalStep
	}
	t.mu.Unlock()

	if plan.PickSpace > maxPickSpace {
		return fmt.Errorf("libtorch trainer: pick space %d exceeds the limit of %d", plan.PickSpace, maxPickSpace)
	}
	scale, err := plan.LRMultiplier()
	if err != nil {
		return fmt.Errorf("libtorch trainer: %w", err)
	}
	picks, err := t.picker.Picks(plan)
	if err != nil {
		return fmt.Errorf("libtorch trainer: %w", err)
	}
	if len(picks) == 0 {
		return nil
	}
	// A CUDA model's steps queue kernels: the wake-ups a run saves cost it
	// little, and it keeps the loop the GPU check exercised. A spare core
	// changes nothing here (trainRuns says why).
	if plan.ReportMerge > 0 && onCPU && t.s.sleepFor(t.cfg.Rank) == 0 {
		return t.trainRuns(ctx, gen, data, sd, plan, picks, int(batch), scale, report)
	}

	// take cuts the next batch's picks.
	take := func() []uint64 {
		n := min(batch, uint64(len(picks)))
		p := picks[:n]
		picks = picks[n:]
		return p
	}
	// next hands the loop its next batch, and release returns one.
	next := func() (*batchBuf, bool) {
		if len(picks) == 0 {
			return nil, false
		}
		bufs[0].fill(t.shim, data, sd, take())
		return bufs[0], true
	}
	release := func(*batchBuf) {}
	if prefetch {
		free := make(chan *batchBuf, len(bufs))
		for _, b := range bufs {
			free <- b
		}
		ready := make(chan *batchBuf)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(ready)
			for len(picks) > 0 {
				var b *batchBuf
				select {
				case b = <-free:
				case <-stop:
					return
				}
				b.fill(t.shim, data, sd, take())
				select {
				case ready <- b:
				case <-stop:
					return
				}
			}
		}()
		defer func() {
			close(stop)
			wg.Wait()
		}()
		next = func() (*batchBuf, bool) {
			b, ok := <-ready
			return b, ok
		}
		release = func(b *batchBuf) { free <- b }
	}

	yielded, last := time.Now(), time.Now()
	for n := uint64(0); ; n++ {
		start := time.Now()
		// Yield before the next step, as long as the last, could carry the
		// loop past the Go runtime's own preemption (see yieldWithin).
		if start.Sub(yielded)+start.Sub(last) >= yieldWithin {
			runtime.Gosched()
			start = time.Now()
			yielded = start
		}
		last = start
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("libtorch trainer: stopped before batch %d: %w", n, err)
		}
		b, ok := next()
		if !ok {
			return nil
		}
		if b.err != nil {
			return fmt.Errorf("libtorch trainer: epoch %d batch %d: %w", plan.Epoch, n, b.err)
		}
		if t.traceBatch != nil {
			t.traceBatch(plan.Epoch, b.idx[:b.n])
		}
		rep, err := t.step(gen, data, b, start, scale)
		release(b)
		if err != nil {
			return fmt.Errorf("libtorch trainer: epoch %d batch %d: %w", plan.Epoch, n, err)
		}
		rep.Batch = n
		if err := report(rep); err != nil {
			return err
		}
	}
}

// trainRuns is Train's batch loop where the plan lets reports merge
// (plan.ReportMerge: a rank training alone): the shim gathers and trains
// a run of steps as long as the merge interval in each call
// (shim.Model.TrainSteps), with no Go code between them. Go's sysmon preempts a goroutine that ran
// 10 ms, and a locked thread takes two context switches and a second
// thread's wake-up to get back its P, whether preempted or yielding: some
// 125 hand-offs a second beside a loop of short steps, each taking a core
// from libtorch's threads, which wait for each other at every parallel
// region. A run of steps pays for one. Reports go after each run, and
// whoever else wants the model (a Publish, a checkpoint, Shutdown: see
// lock) or a stop ends the run after the step in progress. It gathers on
// the training thread even with a core to spare: at 1 thread on 2 cores,
// epochs alternating between a run and the prefetching loop within one
// lone-rank run came out up to 6% faster as runs (paired medians over
// 20-30 pairs): the shim's gather (some 40 µs of a 1.4 ms step) costs the
// training thread less than the loop's hand-offs to its goroutine and Go
// code between the steps. d is data as the shim reads it (shimData).
func (t *Trainer) trainRuns(ctx context.Context, gen uint64, data *dataset.Set, d *shim.Data, plan plugin.Plan, picks []uint64, batch int, scale float64, report func(plugin.BatchReport) error) error {
	var cancel int32
	defer context.AfterFunc(ctx, func() { atomic.StoreInt32(&cancel, 1) })()
	rows := make([]uint64, len(picks))
	for i, p := range picks {
		rows[i] = p % uint64(data.N())
	}
	defer data.KeepMapped()
	batches := (len(rows) + batch - 1) / batch
	lrs, out := make([]float64, batches), make([]shim.Step, batches)
	for n := uint64(0); len(rows) > 0; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("libtorch trainer: stopped before batch %d: %w", n, err)
		}
		locking := time.Now()
		t.mu.Lock()
		held := time.Since(locking)
		if t.model == nil || t.gen != gen {
			t.mu.Unlock()
			return fmt.Errorf("libtorch trainer: epoch %d batch %d: the trainer was shut down or reconfigured while training", plan.Epoch, n)
		}
		left := (len(rows) + batch - 1) / batch
		for i := range left {
			lrs[i] = t.s.lrAt(t.schedStep+uint64(i)) * scale
		}
		wantNorm := time.Since(t.normAt) >= paramNormEvery
		k, v, err := t.model.TrainSteps(d, rows, batch, lrs[:left], plan.ReportMerge, &t.waiting, &cancel, wantNorm, out, t.errBuf)
		t.runs++
		first := t.steps
		t.steps += uint64(k)
		t.schedStep += uint64(k)
		var norm *float64
		if wantNorm && k > 0 && err == nil {
			norm, t.normAt = &v, time.Now()
		}
		t.mu.Unlock()
		for i, st := range out[:k] {
			if t.traceBatch != nil {
				t.traceBatch(plan.Epoch, rows[:st.Rows])
			}
			rep := plugin.BatchReport{Batch: n, Samples: uint32(st.Rows), Loss: st.Loss, StepCount: first + uint64(i) + 1,
				Scalars: map[string]float64{"lr": lrs[i]}, DataMS: plugin.Milliseconds(st.Gather), BatchMS: plugin.Milliseconds(st.Total)}
			if i == 0 {
				// What the run waited for the model is what a round (or
				// another caller) held training.
				rep.RoundWaitMS = plugin.Milliseconds(held)
				rep.BatchMS += rep.RoundWaitMS
			}
			if i == k-1 {
				rep.ParamNorm = norm
			}
			rows, n = rows[st.Rows:], n+1
			if err := report(rep); err != nil {
				return err
			}
		}
		if err != nil {
			return fmt.Errorf("libtorch trainer: epoch %d batch %d: %w", plan.Epoch, n, err)
		}
		if k == 0 {
			// Someone waiting for the model stopped the run before its
			// first step: let them have it.
			runtime.Gosched()
		}
	}
	return nil
}

// lock takes t.mu for a call from outside the batch loop. A run of steps
// in the shim (trainRuns) holds it for up to a merge interval; the count
// it reads makes it return after the step in progress.
func (t *Trainer) lock() {
	atomic.AddInt32(&t.waiting, 1)
	t.mu.Lock()
	atomic.AddInt32(&t.waiting, -1)
}

// step trains one gathered batch; start is when the training thread began
// waiting for it, so DataMS is the wait the gather still cost it; lrScale
// multiplies the schedule's rate.
func (t *Trainer) step(gen uint64, data *dataset.Set, b *batchBuf, start time.Time, lrScale float64) (plugin.BatchReport, error) {
	dataTime := time.Since(start)
	// While Train runs only a round's Publish or Adopt takes the lock: the
	// wait for it is what the round held training.
	locking := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	held := time.Since(locking)
	if t.model == nil || t.gen != gen {
		return plugin.BatchReport{}, errors.New("the trainer was shut down or reconfigured while training")
	}
	n := b.n
	y, tg := b.targets(data.Width())
	lr := t.s.lrAt(t.schedStep) * lrScale
	loss, err := t.model.TrainStep(b.x[:n*data.Features()], n, y, tg, data.Width(), lr, t.errBuf)
	if err != nil {
		return plugin.BatchReport{}, err
	}
	t.steps++
	t.schedStep++
	if d := t.s.sleepFor(t.cfg.Rank); d > 0 {
		time.Sleep(d) // a slower device: the batch takes longer
	}
	rep := plugin.BatchReport{Samples: uint32(n), Loss: loss, StepCount: t.steps, Scalars: map[string]float64{"lr": lr}}
	if now := time.Now(); now.Sub(t.normAt) >= paramNormEvery {
		if norm, err := t.model.Norm(); err == nil {
			rep.ParamNorm = &norm
			t.normAt = now
		}
	}
	rep.DataMS = plugin.Milliseconds(dataTime)
	rep.BatchMS = plugin.Milliseconds(time.Since(start))
	rep.RoundWaitMS = plugin.Milliseconds(held)
	return rep, nil
}
