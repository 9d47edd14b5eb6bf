package main

// A row's figures: targets, times to them, the wire kept, and the printed
// line and JSON line.

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/cohortdl/cohort/bench/internal/matrix"
)

// trainSamples is Fashion-MNIST's training split.
const trainSamples = 60000

// stepsPerEpoch is the steps each DDP rank takes in an epoch: whole
// batches of its 1/hosts share, as the peer cuts them.
func stepsPerEpoch(ranks, batch int) int { return (trainSamples/ranks-batch)/batch + 1 }

// Goals of the ≥ 5 M-parameter model's rows: cohort's time to the target
// over DDP's at most these, per rate; its final accuracy at least DDP's
// less goalAccDiff points.
var ratioGoals = map[string]float64{"1gbit": 0.3, "100mbit": 0.15}

const (
	goalModel   = "wide"
	goalAccDiff = -0.1
)

// ddpRun is DDP's side of a row.
type ddpRun struct {
	// Elapsed is the seconds from the first step to the end of each
	// epoch's evaluation, Accuracy each epoch's test accuracy.
	Elapsed  []float64
	Accuracy []float64
	Target   float64
	// Bytes is what each host sent per epoch, the mean over hosts.
	Bytes float64
	// Bounded runs time Steps steps, StepS each, and read the accuracy
	// from the curve of the run at CurveFrom (a rate).
	Bounded   bool
	CurveFrom string
	Steps     int
	StepS     float64
}

// cohortRun is one of cohort's runs of a row.
type cohortRun struct {
	Wire     string
	Seconds  []float64 // each epoch's, from the summary
	Accuracy []float64
	Bytes    float64 // per host per epoch, the mean over hosts
	Rounds   uint64
}

// target is the model's target accuracy from DDP's curve: the MLP's is
// 85%; the others' DDP's accuracy after the epoch before the last (the
// first when there is one), rounded down to half a point.
func target(m model, acc []float64) float64 {
	if m.Name == "mlp" {
		return 0.85
	}
	e := max(m.Epochs-1, 1) - 1
	return math.Floor(acc[e]*200+1e-9) / 200
}

// toTarget is the cumulative seconds up to and including the first epoch
// at or above target; false when none is.
func toTarget(seconds, acc []float64, target float64) (float64, bool) {
	t := 0.0
	for i, s := range seconds {
		t += s
		if i < len(acc) && acc[i] >= target {
			return t, true
		}
	}
	return 0, false
}

// ddpToTarget is DDP's time to the target: where it ran in full, the
// elapsed seconds of its first epoch at the target; bounded, its step
// time times the steps of the epochs its curve needed.
func (d *ddpRun) toTarget() (float64, bool) {
	for i, a := range d.Accuracy {
		if a >= d.Target {
			if d.Bounded {
				return float64(i+1) * float64(stepsPerEpoch(hosts, batch)) * d.StepS, true
			}
			return d.Elapsed[i], true
		}
	}
	return 0, false
}

// row is one model at one rate.
type row struct {
	model   model
	rate    string
	params  int
	ddp     *ddpRun
	cohorts []cohortRun
	kept    int // the index of the wire kept
	notes   []string
}

// settle keeps the wire that reached the target first (the higher final
// accuracy where none did) and notes the others.
func (r *row) settle() {
	best, bestT, bestReached := 0, 0.0, false
	for i, c := range r.cohorts {
		t, ok := toTarget(c.Seconds, c.Accuracy, r.ddp.Target)
		switch {
		case ok && (!bestReached || t < bestT):
			best, bestT, bestReached = i, t, true
		case !ok && !bestReached && last(c.Accuracy) > last(r.cohorts[best].Accuracy):
			best = i
		}
	}
	r.kept = best
	for i, c := range r.cohorts {
		if i == best {
			continue
		}
		t, ok := toTarget(c.Seconds, c.Accuracy, r.ddp.Target)
		ratio := "-"
		if dt, dOK := r.ddp.toTarget(); ok && dOK && dt > 0 {
			ratio = fmt.Sprintf("%.3f", t/dt)
		}
		r.notes = append(r.notes, fmt.Sprintf("%s wire: to target %s (ratio %s), accuracy %.2f%% (%+.2f points), %.1f MB/rank/epoch, %d rounds",
			c.Wire, secs(t, ok), ratio, 100*last(c.Accuracy), 100*(last(c.Accuracy)-last(r.ddp.Accuracy)), c.Bytes/1e6, c.Rounds))
	}
	for _, c := range r.cohorts {
		r.notes = append(r.notes, fmt.Sprintf("cohort %s per epoch: %s", c.Wire, curve(c.Accuracy, cumulative(c.Seconds))))
	}
	if !r.ddp.Bounded {
		r.notes = append(r.notes, "DDP per epoch: "+curve(r.ddp.Accuracy, r.ddp.Elapsed))
	}
	if r.ddp.Bounded {
		r.notes = append(r.notes, fmt.Sprintf("DDP estimated: %d steps measured here at %.3f s each; time to target = that × %d steps per epoch × the epochs its curve at %s needed (evaluation not counted); accuracy from that curve",
			r.ddp.Steps, r.ddp.StepS, stepsPerEpoch(hosts, batch), r.ddp.CurveFrom))
	}
}

// curve is "acc% at t s" per epoch.
func curve(acc, at []float64) string {
	var parts []string
	for i := range acc {
		parts = append(parts, fmt.Sprintf("%.2f%% at %.1f s", 100*acc[i], at[i]))
	}
	return strings.Join(parts, ", ")
}

func cumulative(xs []float64) []float64 {
	out := make([]float64, len(xs))
	t := 0.0
	for i, x := range xs {
		t += x
		out[i] = t
	}
	return out
}

func last(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

func (r *row) figures() (c cohortRun, ct, dt float64, cOK, dOK bool, ratio *float64) {
	c = r.cohorts[r.kept]
	ct, cOK = toTarget(c.Seconds, c.Accuracy, r.ddp.Target)
	dt, dOK = r.ddp.toTarget()
	if cOK && dOK && dt > 0 {
		ratio = ptr(round4(ct / dt))
	}
	return
}

func header() string {
	return fmt.Sprintf("%-11s  %9s  %6s  %4s  %13s  %11s  %6s  %6s  %10s  %8s  %6s  %13s  %13s", "model", "params", "target", "wire",
		"cohort→target", "DDP→target", "ratio", "goal", "cohort acc", "DDP acc", "diff", "cohort MB/r/e", "DDP MB/r/e")
}

func (r *row) text() string {
	c, ct, dt, cOK, dOK, ratio := r.figures()
	goal := "-"
	if g, ok := r.goal(); ok {
		goal = fmt.Sprintf("≤%.2f", g)
	}
	ddpT := secs(dt, dOK)
	if r.ddp.Bounded {
		ddpT = "~" + ddpT
	}
	return fmt.Sprintf("%-11s  %9d  %5.1f%%  %4s  %13s  %11s  %6s  %6s  %9.2f%%  %7.2f%%  %+6.2f  %13.1f  %13.1f%s", r.model.Name, r.params, 100*r.ddp.Target, c.Wire,
		secs(ct, cOK), ddpT, ratioStr(ratio), goal, 100*last(c.Accuracy), 100*last(r.ddp.Accuracy), r.diff(), c.Bytes/1e6, r.ddp.Bytes/1e6, r.verdict())
}

// goal is the row's time-ratio goal, if it has one.
func (r *row) goal() (float64, bool) {
	if r.model.Name != goalModel {
		return 0, false
	}
	g, ok := ratioGoals[r.rate]
	return g, ok
}

func (r *row) diff() float64 {
	return round3(100 * (last(r.cohorts[r.kept].Accuracy) - last(r.ddp.Accuracy)))
}

// verdict is " pass" or " FAIL" for a row with a goal.
func (r *row) verdict() string {
	g, ok := r.goal()
	if !ok {
		return ""
	}
	_, _, _, _, _, ratio := r.figures()
	if ratio != nil && *ratio <= g && r.diff() >= goalAccDiff {
		return "  pass"
	}
	return "  FAIL"
}

// matrixLine is a row's JSON line: the matrix's, and what a row across
// hosts adds to it.
type matrixLine struct {
	matrix.Line
	Epochs       int      `json:"epochs"`
	RatioGoal    *float64 `json:"time_ratio_goal,omitempty"`
	DDPEstimated bool     `json:"ddp_estimated"`
	Wire         string   `json:"wire"`
}

func (r *row) line() matrixLine {
	c, ct, dt, cOK, dOK, ratio := r.figures()
	l := matrixLine{Line: matrix.Line{Bench: "matrix", Model: r.model.Name, Optimizer: r.model.Optimizer, Where: "netns-" + r.rate,
		Params: r.params, Seeds: 1, Target: r.ddp.Target, CohortAccuracy: last(c.Accuracy), DDPAccuracy: last(r.ddp.Accuracy),
		AccDiffPoints: r.diff(), TimeRatio: ratio, Bytes: math.Round(c.Bytes), DDPBytes: math.Round(r.ddp.Bytes)},
		Epochs: r.model.Epochs, DDPEstimated: r.ddp.Bounded, Wire: c.Wire}
	if g, ok := r.goal(); ok {
		l.RatioGoal = &g
	}
	if cOK {
		l.CohortToTarget = ptr(round3(ct))
	}
	if dOK {
		l.DDPToTarget = ptr(round3(dt))
	}
	return l
}

func printJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

func secs(t float64, ok bool) string {
	if !ok {
		return "missed"
	}
	return fmt.Sprintf("%.1f s", t)
}

func ratioStr(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *r)
}

func ptr(f float64) *float64 { return &f }

func round3(f float64) float64 { return math.Round(f*1e3) / 1e3 }
func round4(f float64) float64 { return math.Round(f*1e4) / 1e4 }
