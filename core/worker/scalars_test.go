package worker_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// scalarTrainer is the mock trainer whose batch reports carry the scalars
// script says, per plan (by its offset) and batch.
type scalarTrainer struct {
	*plugintest.Trainer
	script func(offset, batch uint64) map[string]float64
}

func (s *scalarTrainer) Train(ctx context.Context, p plugin.Plan, report func(plugin.BatchReport) error) error {
	return s.Trainer.Train(ctx, p, func(b plugin.BatchReport) error {
		b.Scalars = s.script(p.PartitionOffset, b.Batch)
		return report(b)
	})
}

// TestPlanScalars: a plan's Metrics sums its batches' scalars per name;
// invalid names, names past the limit and non-finite values are dropped,
// with one warning for a plan that dropped names and none for the others.
func TestPlanScalars(t *testing.T) {
	many := func(prefix string, n int) map[string]float64 {
		m := map[string]float64{}
		for i := range n {
			m[fmt.Sprintf("%s%02d", prefix, i)] = 1
		}
		return m
	}
	sum := func(s float64, n uint64) *wirepb.ScalarSum { return &wirepb.ScalarSum{Sum: s, Count: n} }
	cases := []struct {
		name  string
		batch func(b uint64) map[string]float64
		want  map[string]*wirepb.ScalarSum
		warns bool
	}{
		{
			name:  "summed per name",
			batch: func(b uint64) map[string]float64 { return map[string]float64{"lr": 0.5, "grad/norm": float64(b + 1)} },
			want:  map[string]*wirepb.ScalarSum{"lr": sum(1, 2), "grad/norm": sum(3, 2)},
		},
		{
			name:  "no scalars",
			batch: func(uint64) map[string]float64 { return nil },
		},
		{
			name: "names at the edges of the rule",
			batch: func(uint64) map[string]float64 {
				return map[string]float64{"a": 1, strings.Repeat("x", 64): 2, "a.b-c_d/0": 3}
			},
			want: map[string]*wirepb.ScalarSum{"a": sum(2, 2), strings.Repeat("x", 64): sum(4, 2), "a.b-c_d/0": sum(6, 2)},
		},
		{
			name: "invalid names dropped",
			batch: func(uint64) map[string]float64 {
				return map[string]float64{"lr": 1, "": 1, "LR": 1, "has space": 1, strings.Repeat("x", 65): 1, "é": 1, "nul\x00": 1}
			},
			want:  map[string]*wirepb.ScalarSum{"lr": sum(2, 2)},
			warns: true,
		},
		{
			name: "non-finite values dropped",
			batch: func(b uint64) map[string]float64 {
				if b == 0 {
					return map[string]float64{"lr": math.NaN(), "x": 1}
				}
				return map[string]float64{"lr": 2, "x": math.Inf(-1)}
			},
			want: map[string]*wirepb.ScalarSum{"lr": sum(2, 1), "x": sum(1, 1)},
		},
		{
			// The first batch's 40 names: the first 32 in byte order stay;
			// the second batch's new name finds no room, early in byte
			// order or not.
			name: "too many names",
			batch: func(b uint64) map[string]float64 {
				m := many("s", 40)
				if b == 1 {
					m["a"] = 1
				}
				return m
			},
			want: func() map[string]*wirepb.ScalarSum {
				m := map[string]*wirepb.ScalarSum{}
				for name := range many("s", 32) {
					m[name] = sum(2, 2)
				}
				return m
			}(),
			warns: true,
		},
	}

	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	var logs plugintest.LogBuffer
	o.Logger = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	// Plan i covers [32i, 32i+32): two batches of 16.
	tr := &scalarTrainer{Trainer: plugintest.NewTrainer(nil), script: func(offset, b uint64) map[string]float64 {
		return cases[offset/32].batch(b)
	}}
	o.Plugins = worker.InProcess(tr, plugintest.NewAverager(nil))
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "scalars", Seed: 3})
	expect[*wirepb.Ready](l)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			off := uint64(32 * i)
			l.send(&wirepb.StartEpoch{Plan: plan(0, off, 32, 3, 256)})
			got := expectPlan(l, 2).GetScalars()
			if len(got) != len(tc.want) {
				t.Errorf("Metrics carries %d scalars %v, want %d: %v", len(got), got, len(tc.want), tc.want)
			}
			for name, w := range tc.want {
				if g := got[name]; g.GetSum() != w.GetSum() || g.GetCount() != w.GetCount() {
					t.Errorf("scalar %q = %v, want %v", name, g, w)
				}
			}
			// The warning comes before the plan's Metrics.
			warnings := 0
			for line := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(line, "dropped trainer scalars") && strings.Contains(line, fmt.Sprintf(" offset=%d ", off)) {
					warnings++
				}
			}
			if want := map[bool]int{true: 1}[tc.warns]; warnings != want {
				t.Errorf("%d warnings for the plan, want %d; log:\n%s", warnings, want, logs.String())
			}
		})
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
}
