package status

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/cohortdl/cohort/shared/atomicfile"
)

// CurvesFile is the curves' name in the run's out directory.
const CurvesFile = "curves.png"

// WriteCurves draws a run's curves to path as PNG, atomically: training
// (and evaluation) loss and accuracy per epoch, and the training loss per
// averaging round.
func WriteCurves(path string, epochs []EpochPoint, rounds []RoundPoint) error {
	panels, err := curvePlots(epochs, rounds)
	if err != nil {
		return err
	}
	plots := [][]*plot.Plot{panels}
	const w, h = 15 * vg.Inch, 4 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for i, pl := range panels {
		pl.Draw(canvases[0][i])
	}
	err = atomicfile.Write(path, func(w io.Writer) error {
		_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
		return err
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// curvePlots are the curves' three panels.
func curvePlots(epochs []EpochPoint, rounds []RoundPoint) ([]*plot.Plot, error) {
	var loss, eval, acc, roundLoss plotter.XYs
	for _, e := range epochs {
		loss = append(loss, plotter.XY{X: float64(e.Epoch), Y: e.Loss})
		if e.EvalLoss != nil {
			eval = append(eval, plotter.XY{X: float64(e.Epoch), Y: *e.EvalLoss})
		}
		if e.Accuracy != nil {
			acc = append(acc, plotter.XY{X: float64(e.Epoch), Y: *e.Accuracy})
		}
	}
	for _, r := range rounds {
		if r.Loss != nil {
			roundLoss = append(roundLoss, plotter.XY{X: float64(r.Round), Y: *r.Loss})
		}
	}
	panels := []struct {
		title, x, y string
		lines       []any
	}{
		{"Loss per epoch", "epoch", "loss", named("train", loss, "eval", eval)},
		{"Accuracy per epoch", "epoch", "accuracy", named("eval", acc)},
		{"Training loss per round", "round", "loss", named("train", roundLoss)},
	}
	var plots []*plot.Plot
	for _, p := range panels {
		pl := plot.New()
		pl.Title.Text, pl.X.Label.Text, pl.Y.Label.Text = p.title, p.x, p.y
		if len(p.lines) > 0 {
			if err := plotutil.AddLinePoints(pl, p.lines...); err != nil {
				return nil, fmt.Errorf("draw %s: %w", p.title, err)
			}
			fitAxes(pl, p.lines)
		}
		plots = append(plots, pl)
	}
	return plots, nil
}

// named is AddLinePoints' arguments for the series that have points: a
// series with none would draw nothing and fail the legend.
func named(pairs ...any) []any {
	var out []any
	for i := 0; i+1 < len(pairs); i += 2 {
		if xy := pairs[i+1].(plotter.XYs); len(xy) > 0 {
			out = append(out, pairs[i], xy)
		}
	}
	return out
}

// fitAxes makes pl's axes fit its series (AddLinePoints' name, XYs
// pairs): the x axis counts epochs or rounds in whole numbers, one point
// centred on it; a flat y (one point, or float noise) spans a tenth of
// its value either side, not gonum's 0 to twice it; and the legend, only
// where there is more than one series, sits in headroom above the lines.
func fitAxes(pl *plot.Plot, lines []any) {
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for i := 1; i < len(lines); i += 2 {
		for _, p := range lines[i].(plotter.XYs) {
			xmin, xmax = min(xmin, p.X), max(xmax, p.X)
			ymin, ymax = min(ymin, p.Y), max(ymax, p.Y)
		}
	}
	if xmin == xmax {
		xmin, xmax = xmin-0.5, xmax+0.5
	}
	pl.X.Min, pl.X.Max = xmin, xmax
	pl.X.Tick.Marker = wholeTicks{}
	if mag := max(math.Abs(ymin), math.Abs(ymax)); ymax-ymin <= mag*1e-6 {
		mid, pad := (ymin+ymax)/2, cmp.Or(mag*0.1, 0.5)
		ymin, ymax = mid-pad, mid+pad
	}
	pl.Y.Min, pl.Y.Max = ymin, ymax
	if len(lines) <= 2 {
		pl.Legend = plot.NewLegend() // one series: the title names it
		return
	}
	pl.Y.Max = ymax + (ymax-ymin)*0.25
	pl.Legend.Top = true
}

// wholeTicks marks whole numbers only (epochs, rounds), at most about
// ten of them, at a step of 1, 2 or 5 times a power of ten.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
	for _, m := range []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6} {
		step = m
		if (hi-lo)/m <= 10 {
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi && len(ticks) < 1000; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
}
