package main

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cohortdl/cohort/core/status"
)

// oneEpochSnapshot is the status of a finished 1-epoch run of 2 ranks: one
// point per epoch curve, a flat learning rate (with float noise), no
// controller decision, no membership change.
func oneEpochSnapshot() *status.Snapshot {
	now := time.Now().UTC()
	acc, eval := 0.8288, 0.4752
	s := &status.Snapshot{
		RunID: "20261202T120000Z-1epoch", Status: "completed", Policy: "sync", Trainer: "libtorch", Averager: "cpu",
		Time: now, Started: now.Add(-4 * time.Second), World: 2, Live: 0, Epoch: 1, Epochs: 1,
		EpochDone: 60000, EpochTotal: 60000, GlobalStep: 469, Totals: status.Totals{Rounds: 25, RoundSeconds: 0.2, BytesAveraged: 36864},
		Ranks: []status.Rank{{Rank: 0, State: "exited", Epoch: 1, Batches: 469}, {Rank: 1, State: "exited", Epoch: 1, Batches: 469}},
		EpochCurve: []status.EpochPoint{{Epoch: 1, Loss: 0.7, EvalLoss: &eval, Accuracy: &acc, Seconds: 1, Samples: 60000, Rounds: 24,
			Scalars: map[string]float64{"lr": 0.1 + 1e-12}}},
		Controller: status.Controller{Interval: 10, LRScale: 1},
	}
	for i := range 25 {
		l := 0.4 + 1.6/float64(i+1)
		s.RoundCurve = append(s.RoundCurve, status.RoundPoint{Round: uint64(i), Epoch: 1, Loss: &l, Seconds: 0.008 + 0.001*float64(i%3), Time: now})
	}
	return s
}

// The status page of a 1-epoch run, in a real browser: every chart's two y
// labels differ (a flat learning rate included), its points lie inside it
// and show (a lone point as a mark), a single epoch is labelled once on
// the x axis, and an empty list
// (decisions, membership) is no item: the list is hidden and its "none"
// line shown. The screenshot goes to $COHORT_TEST_ARTIFACTS when set.
func TestStatusPageOneEpoch(t *testing.T) {
	ctx := chromium(t)
	snap := oneEpochSnapshot()
	srv := httptest.NewServer(status.Handler(func() *status.Snapshot { return snap }))
	defer srv.Close()
	type chart struct {
		ID      string
		YLabels []string
		XLabels []string
		Inside  bool
		Lines   int
	}
	type pageFigures struct {
		Charts     []chart
		EmptyItems int
		ListsShown []string
		NoneShown  []string
	}
	const probe = `(() => {
	  const charts = [...document.querySelectorAll("svg")].map((svg) => {
	    const texts = [...svg.querySelectorAll("text")];
	    const lines = [...svg.querySelectorAll("polyline")];
	    const dots = [...svg.querySelectorAll("circle")];
	    const pts = lines.flatMap((l) => l.getAttribute("points").split(" ").map((p) => p.split(",").map(Number)))
	      .concat(dots.map((c) => [Number(c.getAttribute("cx")), Number(c.getAttribute("cy"))]));
	    const inside = pts.every(([x, y]) => x >= 0 && x <= 400 && y >= 0 && y <= 160);
	    // What shows: a line of two points or more, or a single point's mark.
	    const shown = lines.filter((l) => Number(l.dataset.points) > 1).length + dots.length;
	    return { ID: svg.id || svg.parentElement.dataset.name, YLabels: texts.slice(0, 2).map((t) => t.textContent),
	      XLabels: texts.slice(2).map((t) => t.textContent), Inside: inside, Lines: shown };
	  });
	  const lists = ["decisions", "timeline"];
	  return {
	    Charts: charts,
	    EmptyItems: document.querySelectorAll("li.none").length,
	    ListsShown: lists.filter((id) => !document.getElementById(id).hidden),
	    NoneShown: lists.filter((id) => !document.getElementById(id + "-none").hidden),
	  };
	})()`
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(rctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	var got pageFigures
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if got, err = chromedp.Run(rctx, chromedp.Evaluate[pageFigures](probe)); err != nil {
			t.Fatal(err)
		}
		if len(got.Charts) == 5 || time.Now().After(deadline) { // drawn once the first poll is in
			break
		}
	}
	if len(got.Charts) != 5 {
		t.Fatalf("%d charts, want loss, accuracy, round loss, round time and lr: %+v", len(got.Charts), got.Charts)
	}
	for _, c := range got.Charts {
		if len(c.YLabels) != 2 || c.YLabels[0] == c.YLabels[1] || !c.Inside || c.Lines == 0 {
			t.Errorf("chart %s: y labels %q, points inside %v, %d series shown", c.ID, c.YLabels, c.Inside, c.Lines)
		}
		if (c.ID == "epoch-loss" || c.ID == "epoch-acc" || c.ID == "lr") && (len(c.XLabels) != 1 || c.XLabels[0] != "1") {
			t.Errorf("chart %s: x labels %q, want the one epoch, 1", c.ID, c.XLabels)
		}
	}
	if got.EmptyItems != 0 || len(got.ListsShown) != 0 || len(got.NoneShown) != 2 {
		t.Errorf("empty lists: %d items of nothing, lists shown %v, none lines shown %v", got.EmptyItems, got.ListsShown, got.NoneShown)
	}
	shot, err := chromedp.Run(rctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("COHORT_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.WriteFile(filepath.Join(dir, "status-page-1-epoch.png"), shot, 0o644); err != nil {
		t.Fatal(err)
	}
}
