package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

// recorder gathers what the simulated ranks see, on the harness's clock.
type recorder struct {
	mu       sync.Mutex
	formedAt time.Time            // the last rank's SetEpochCallbackRole
	issued   map[uint64]time.Time // round -> first Sync seen
	done     map[uint64]time.Time // round -> first Update of that version seen
	kills    map[uint32]killNote
	declared map[uint32]time.Time // rank -> first DeclareDead for it seen
	exits    int
	progress chan struct{} // signalled on every round completion
}

type killNote struct {
	kind killKind
	at   time.Time
}

func newRecorder() *recorder {
	return &recorder{
		issued:   map[uint64]time.Time{},
		done:     map[uint64]time.Time{},
		kills:    map[uint32]killNote{},
		declared: map[uint32]time.Time{},
		progress: make(chan struct{}, 1),
	}
}

func (r *recorder) formed(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at.After(r.formedAt) {
		r.formedAt = at
	}
}

func firstAt(m map[uint64]time.Time, k uint64, at time.Time) {
	if t, ok := m[k]; !ok || at.Before(t) {
		m[k] = at
	}
}

func (r *recorder) roundIssued(round uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	firstAt(r.issued, round, at)
}

func (r *recorder) roundDone(round uint64, at time.Time) {
	r.mu.Lock()
	firstAt(r.done, round, at)
	r.mu.Unlock()
	select {
	case r.progress <- struct{}{}:
	default:
	}
}

func (r *recorder) killedAt(rank uint32, kind killKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kills[rank] = killNote{kind, time.Now()}
}

func (r *recorder) declaredAt(rank uint32, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.declared[rank]; !ok || at.Before(t) {
		r.declared[rank] = at
	}
}

func (r *recorder) exited() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exits++
}

// waitRounds waits until n rounds have completed.
func (r *recorder) waitRounds(ctx context.Context, n int) error {
	for {
		r.mu.Lock()
		got := len(r.done)
		r.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-r.progress:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d completed rounds, saw %d: %w", n, got, ctx.Err())
		}
	}
}

// roundMS is each completed round's time, from its first Sync to its first
// Update as the ranks saw them.
func (r *recorder) roundMS() []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []float64
	for k, end := range r.done {
		if start, ok := r.issued[k]; ok {
			out = append(out, plugin.Milliseconds(end.Sub(start)))
		}
	}
	return out
}

// detections is each killed rank's detection delay (the first DeclareDead
// for it, from its kill) by kind; undetected counts the ranks no survivor
// heard of.
func (r *recorder) detections() (byKind map[killKind][]float64, undetected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byKind = map[killKind][]float64{}
	for rank, k := range r.kills {
		t, ok := r.declared[rank]
		if !ok {
			undetected++
			continue
		}
		byKind[k.kind] = append(byKind[k.kind], t.Sub(k.at).Seconds())
	}
	return byKind, undetected
}

// quantile is the q-quantile of xs (nearest rank); 0 for none (JSON has
// no NaN).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}
