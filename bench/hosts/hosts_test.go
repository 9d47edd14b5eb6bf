package main

import (
	"math"
	"strings"
	"testing"
)

func TestStepsPerEpoch(t *testing.T) {
	// The peer steps over range(0, share-batch+1, batch): 15000 samples a
	// rank make 234 whole batches of 64.
	for _, c := range []struct{ ranks, batch, want int }{{4, 64, 234}, {1, 64, 937}, {4, 15000, 1}, {3, 100, 200}} {
		if got := stepsPerEpoch(c.ranks, c.batch); got != c.want {
			t.Errorf("stepsPerEpoch(%d, %d) = %d, want %d", c.ranks, c.batch, got, c.want)
		}
	}
}

func TestTarget(t *testing.T) {
	for _, c := range []struct {
		name   string
		epochs int
		acc    []float64
		want   float64
	}{
		{"mlp", 3, []float64{0.5, 0.6, 0.7}, 0.85},
		{"cnn", 3, []float64{0.84, 0.8769, 0.89}, 0.875},
		{"wide", 2, []float64{0.8549, 0.87}, 0.85},
		{"wide", 1, []float64{0.861}, 0.86},
		{"transformer", 3, []float64{0.8, 0.85, 0.86}, 0.85}, // exactly on a half point stays
	} {
		if got := target(model{Name: c.name, Epochs: c.epochs}, c.acc); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("target(%s, %d epochs, %v) = %v, want %v", c.name, c.epochs, c.acc, got, c.want)
		}
	}
}

func TestToTarget(t *testing.T) {
	for _, c := range []struct {
		secs, acc []float64
		want      float64
		ok        bool
	}{
		{[]float64{10, 20, 30}, []float64{0.8, 0.86, 0.87}, 30, true},
		{[]float64{10, 20}, []float64{0.86, 0.8}, 10, true},
		{[]float64{10, 20}, []float64{0.8, 0.84}, 0, false},
		{nil, nil, 0, false},
	} {
		got, ok := toTarget(c.secs, c.acc, 0.85)
		if ok != c.ok || got != c.want {
			t.Errorf("toTarget(%v, %v) = %v, %v; want %v, %v", c.secs, c.acc, got, ok, c.want, c.ok)
		}
	}
}

func TestDDPToTarget(t *testing.T) {
	full := &ddpRun{Elapsed: []float64{50, 101}, Accuracy: []float64{0.84, 0.86}, Target: 0.85}
	if got, ok := full.toTarget(); !ok || got != 101 {
		t.Errorf("full run: %v, %v; want its second epoch's elapsed 101", got, ok)
	}
	// Bounded: 2 epochs of the curve at 234 steps of 0.5 s.
	bounded := &ddpRun{Accuracy: []float64{0.84, 0.86}, Target: 0.85, Bounded: true, Steps: 12, StepS: 0.5}
	if got, ok := bounded.toTarget(); !ok || got != 2*234*0.5 {
		t.Errorf("bounded run: %v, %v; want %v", got, ok, 2*234*0.5)
	}
	missed := &ddpRun{Elapsed: []float64{50}, Accuracy: []float64{0.84}, Target: 0.85}
	if _, ok := missed.toTarget(); ok {
		t.Error("a run below the target reached it")
	}
}

func TestGradientLinkS(t *testing.T) {
	// The wide MLP at 100 Mbit/s: 234 steps of 1.5 × 23.3 MB.
	got := gradientLinkS(5824522, 1e8)
	want := 234 * 4 * 5824522 * 1.5 * 8 / 1e8
	if math.Abs(got-want) > 1e-6 || got < 600 {
		t.Errorf("gradientLinkS = %v, want %v", got, want)
	}
}

func TestSettleKeepsTheFasterWire(t *testing.T) {
	for _, c := range []struct {
		name    string
		cohorts []cohortRun
		want    string
	}{
		{"faster wins", []cohortRun{
			{Wire: "f32", Seconds: []float64{10, 10}, Accuracy: []float64{0.84, 0.86}},
			{Wire: "bf16", Seconds: []float64{8, 8}, Accuracy: []float64{0.84, 0.86}},
		}, "bf16"},
		{"reaching beats faster", []cohortRun{
			{Wire: "f32", Seconds: []float64{10, 10}, Accuracy: []float64{0.84, 0.86}},
			{Wire: "bf16", Seconds: []float64{8, 8}, Accuracy: []float64{0.84, 0.849}},
		}, "f32"},
		{"neither: higher accuracy", []cohortRun{
			{Wire: "f32", Seconds: []float64{10}, Accuracy: []float64{0.80}},
			{Wire: "bf16", Seconds: []float64{8}, Accuracy: []float64{0.81}},
		}, "bf16"},
	} {
		r := row{model: model{Name: "wide", Epochs: 2}, rate: "1gbit", ddp: &ddpRun{Elapsed: []float64{50, 100}, Accuracy: []float64{0.84, 0.86}, Target: 0.85}, cohorts: c.cohorts}
		r.settle()
		if got := r.cohorts[r.kept].Wire; got != c.want {
			t.Errorf("%s: kept %s, want %s", c.name, got, c.want)
		}
		if len(r.notes) != 4 || !strings.Contains(r.notes[0], "wire") {
			t.Errorf("%s: notes %q, want one naming the other wire", c.name, r.notes)
		}
	}
}

func TestRowVerdictAndLine(t *testing.T) {
	ddp := &ddpRun{Elapsed: []float64{50, 100}, Accuracy: []float64{0.84, 0.86}, Target: 0.85, Bytes: 8e9}
	for _, c := range []struct {
		name  string
		model string
		rate  string
		cacc  float64
		csec  float64
		want  string
		ratio float64
	}{
		{"wide passes", "wide", "1gbit", 0.86, 28, "  pass", 0.28},
		{"wide too slow", "wide", "1gbit", 0.86, 32, "  FAIL", 0.32},
		{"wide below DDP", "wide", "100mbit", 0.8585, 10, "  FAIL", 0.1},
		{"no goal elsewhere", "mlp", "1gbit", 0.86, 80, "", 0.8},
	} {
		r := row{model: model{Name: c.model, Optimizer: "sgd", Epochs: 2}, rate: c.rate, params: 10, ddp: ddp,
			cohorts: []cohortRun{{Wire: "bf16", Seconds: []float64{c.csec / 2, c.csec / 2}, Accuracy: []float64{0.84, c.cacc}, Bytes: 1e8}}}
		r.settle()
		if got := r.verdict(); got != c.want {
			t.Errorf("%s: verdict %q, want %q", c.name, got, c.want)
		}
		l := r.line()
		if l.Where != "netns-"+c.rate || l.TimeRatio == nil || math.Abs(*l.TimeRatio-c.ratio) > 1e-9 || l.Bytes != 1e8 || l.DDPBytes != 8e9 {
			t.Errorf("%s: line %+v, want where netns-%s, ratio %v, bytes 1e8 and 8e9", c.name, l, c.rate, c.ratio)
		}
	}
}

func TestMeanSent(t *testing.T) {
	got := meanSent([]uint64{100, 200}, []uint64{1100, 2200}, 2)
	if got != 750 { // (1000 + 2000) / 2 hosts / 2 epochs
		t.Errorf("meanSent = %v, want 750", got)
	}
}

func TestParseOptions(t *testing.T) {
	var o options
	o.boundedSteps, o.fullEpochS = 12, 150
	if err := o.parse("wide=2,mlp=3", "1gbit,100mbit", "bf16"); err != nil {
		t.Fatal(err)
	}
	if len(o.models) != 2 || o.models[0].Name != "wide" || o.models[0].Epochs != 2 || o.models[0].Optimizer != "sgd" || o.models[1].Name != "mlp" || o.models[1].Epochs != 3 {
		t.Errorf("models %+v, want wide (2 epochs) then mlp (3), in the flag's order", o.models)
	}
	for _, bad := range [][3]string{
		{"resnet=1", "1gbit", "f32"},
		{"mlp=0", "1gbit", "f32"},
		{"mlp=1", "fast", "f32"},
		{"mlp=1", "1gbit", "fp8"},
		{"mlp=1,mlp=2", "1gbit", "f32"},
	} {
		var o options
		o.boundedSteps, o.fullEpochS = 12, 150
		if err := o.parse(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

func TestStepBytes(t *testing.T) {
	for _, c := range []struct {
		out  string
		want uint64
		ok   bool
	}{
		{"{\"epoch\": 0, \"test_accuracy\": 0.5}\n{\"tx_bytes_steps\": 12345}\n", 12345, true},
		{"warning: something\n{\"tx_bytes_steps\": 0}", 0, true},
		{"{\"epoch\": 0}\n", 0, false},
		{"{\"tx_bytes_steps\": -1}\n", 0, false},
	} {
		got, err := stepBytes(c.out)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("stepBytes(%q) = %v, %v; want %v (ok %v)", c.out, got, err, c.want, c.ok)
		}
	}
}
