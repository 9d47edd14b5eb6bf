package status

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// The curves' axes fit their data: a single epoch's point sits inside an
// x axis marked at whole epochs only, and inside a y span of its own size
// (not 0 to twice the value); a flat series is not stretched; every point
// is inside its axes; one series needs no legend.
func TestCurvesAxes(t *testing.T) {
	acc, eval := 0.8288, 0.4752
	for _, tc := range []struct {
		name   string
		epochs []EpochPoint
		rounds []RoundPoint
	}{
		{"one epoch", []EpochPoint{{Epoch: 1, Loss: 0.7, EvalLoss: &eval, Accuracy: &acc}}, rounds(13, func(i int) float64 { return 2 / float64(i+1) })},
		{"flat loss", []EpochPoint{{Epoch: 1, Loss: 0.1}, {Epoch: 2, Loss: 0.1 + 1e-12}}, rounds(3, func(int) float64 { return 0.1 })},
		{"many rounds", []EpochPoint{{Epoch: 1, Loss: 1}, {Epoch: 2, Loss: 0.5}, {Epoch: 3, Loss: 0.4}}, rounds(724, func(i int) float64 { return 1 / float64(i+1) })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plots, err := curvePlots(tc.epochs, tc.rounds)
			if err != nil {
				t.Fatal(err)
			}
			data := [][]float64{{}, {}, {}}
			for _, e := range tc.epochs {
				data[0] = append(data[0], e.Loss)
				if e.EvalLoss != nil {
					data[0] = append(data[0], *e.EvalLoss)
				}
				if e.Accuracy != nil {
					data[1] = append(data[1], *e.Accuracy)
				}
			}
			for _, r := range tc.rounds {
				data[2] = append(data[2], *r.Loss)
			}
			for i, pl := range plots {
				if len(data[i]) == 0 {
					continue
				}
				lo, hi := math.Inf(1), math.Inf(-1)
				for _, v := range data[i] {
					lo, hi = min(lo, v), max(hi, v)
				}
				if pl.Y.Min > lo || pl.Y.Max < hi || pl.Y.Max <= pl.Y.Min {
					t.Errorf("%s: y axis %g..%g, data %g..%g", pl.Title.Text, pl.Y.Min, pl.Y.Max, lo, hi)
				}
				// A flat series keeps a span of about its own size.
				if span, mag := pl.Y.Max-pl.Y.Min, max(math.Abs(lo), math.Abs(hi)); span > 2*(hi-lo)+0.5*mag {
					t.Errorf("%s: y axis %g..%g is far wider than the data %g..%g", pl.Title.Text, pl.Y.Min, pl.Y.Max, lo, hi)
				}
				ticks := pl.X.Tick.Marker.Ticks(pl.X.Min, pl.X.Max)
				labelled := 0
				for _, tk := range ticks {
					if tk.Label != "" {
						labelled++
						if tk.Value != math.Trunc(tk.Value) {
							t.Errorf("%s: x tick at %g, want whole epochs and rounds", pl.Title.Text, tk.Value)
						}
					}
				}
				if labelled == 0 || labelled > 11 {
					t.Errorf("%s: %d labelled x ticks over %g..%g", pl.Title.Text, labelled, pl.X.Min, pl.X.Max)
				}
			}
			if err := WriteCurves(filepath.Join(t.TempDir(), CurvesFile), tc.epochs, tc.rounds); err != nil {
				t.Fatal(err)
			}
		})
	}
	if dir := os.Getenv("COHORT_TEST_ARTIFACTS"); dir != "" {
		if err := WriteCurves(filepath.Join(dir, CurvesFile), []EpochPoint{{Epoch: 1, Loss: 0.7, EvalLoss: &eval, Accuracy: &acc}}, rounds(25, func(i int) float64 { return 0.4 + 1.6/float64(i+1) })); err != nil {
			t.Fatal(err)
		}
	}
}

// rounds are n round points with loss(i).
func rounds(n int, loss func(int) float64) []RoundPoint {
	out := make([]RoundPoint, n)
	for i := range out {
		l := loss(i)
		out[i] = RoundPoint{Round: uint64(i + 1), Loss: &l}
	}
	return out
}
