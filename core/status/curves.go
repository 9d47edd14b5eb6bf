package status

import (
	"fmt"
	"io"
	"path/filepath"

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
	plots := make([][]*plot.Plot, 1)
	for _, p := range panels {
		pl := plot.New()
		pl.Title.Text, pl.X.Label.Text, pl.Y.Label.Text = p.title, p.x, p.y
		if len(p.lines) > 0 {
			if err := plotutil.AddLinePoints(pl, p.lines...); err != nil {
				return fmt.Errorf("draw %s: %w", p.title, err)
			}
		}
		plots[0] = append(plots[0], pl)
	}
	const w, h = 15 * vg.Inch, 4 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for i, pl := range plots[0] {
		pl.Draw(canvases[0][i])
	}
	err := atomicfile.Write(path, func(w io.Writer) error {
		_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
		return err
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
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
