package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// statusURL waits for the launcher's status page line and returns its URL.
func (p *proc) statusURL(timeout time.Duration) string {
	p.t.Helper()
	p.waitLine("status page: ", timeout)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.stdout {
		if u, ok := strings.CutPrefix(l, "status page: "); ok {
			return u
		}
	}
	p.t.Fatal("status page line gone")
	return ""
}

// chromium returns a headless browser context, or skips the test when no
// Chromium can be started at all.
func chromium(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no chromium on PATH (make deps installs Debian's chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelB(); cancelA() })
	// The first action starts the browser, bound to the context it runs
	// on: ctx itself, not a shorter one.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Skipf("chromium %s does not start: %v", path, err)
	}
	return ctx
}

// pageState is what the test reads off the page.
type pageState struct {
	Rows        int    `json:"rows"`
	Batches     int    `json:"batches"`
	RoundPoints int    `json:"round_points"`
	Rank2       string `json:"rank2"`
	Status      string `json:"status"`
	// Scalars are the trainer scalar curves drawn, with their points.
	Scalars  map[string]int `json:"scalars"`
	Interval string         `json:"interval"`
}

const readPage = `(() => {
  const rows = [...document.querySelectorAll("#ranks tbody tr")];
  const pl = document.querySelector("#round-loss polyline");
  const r2 = document.querySelector('#ranks tbody tr[data-rank="2"] td.state');
  return {
    rows: rows.length,
    batches: rows.reduce((n, tr) => n + (parseInt(tr.cells[3].textContent) || 0), 0),
    round_points: pl ? parseInt(pl.dataset.points) : 0,
    rank2: r2 ? r2.textContent : "",
    status: document.getElementById("status").textContent,
    scalars: Object.fromEntries([...document.querySelectorAll("#scalars figure")].map((f) => {
      const p = f.querySelector("polyline");
      return [f.dataset.name, p ? parseInt(p.dataset.points) : 0];
    })),
    interval: document.getElementById("interval").textContent,
  };
})()`

// TestStatusPageInBrowser drives the status page of a mock run in headless
// Chromium: the rank table and the round curve move while it trains, a
// SIGKILLed worker shows as dead, and /metrics parses with counters that
// grow between two scrapes. The screenshot stays in the test's out dir.
func TestStatusPageInBrowser(t *testing.T) {
	ctx := chromium(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "run")
	cfg := writeRunConfig(t, `coordinator {
  heartbeat_timeout = "2s"
  sync_every        = 4
}`, map[string]any{"samples": 2048, "batch_size": 16, "sleep_per_batch": "15ms"})
	p := startCohort(t, "run", "--config", cfg, "--ranks", "3", "--epochs", "3", "--out", out, "--http", "127.0.0.1:0")
	url := p.statusURL(30 * time.Second)
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("status page at %q, want a loopback URL", url)
	}

	read := func() pageState {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := chromedp.Run(rctx, chromedp.Evaluate[pageState](readPage))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		return s
	}
	waitFor := func(what string, timeout time.Duration, ok func(pageState) bool) pageState {
		t.Helper()
		end := time.Now().Add(timeout)
		for {
			s := read()
			if ok(s) {
				return s
			}
			if time.Now().After(end) {
				t.Fatalf("page never showed %s; last %+v\nstderr:\n%s", what, s, p.stderr.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := chromedp.Do(nctx, chromedp.Navigate(url), chromedp.WaitVisible("#ranks")); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	cancel()
	first := waitFor("three ranks training with a round curve", 20*time.Second, func(s pageState) bool {
		return s.Rows == 3 && s.Batches > 0 && s.RoundPoints >= 2
	})
	m1 := scrapeMetrics(t, url+"metrics")
	second := waitFor("the table and the curve moving", 10*time.Second, func(s pageState) bool {
		return s.Batches > first.Batches && s.RoundPoints > first.RoundPoints
	})
	m2 := scrapeMetrics(t, url+"metrics")
	for _, name := range []string{"cohort_batches_total", "cohort_samples_total", "cohort_rounds_total"} {
		if counter(m2, name) <= counter(m1, name) {
			t.Errorf("%s did not grow between scrapes: %v then %v", name, counter(m1, name), counter(m2, name))
		}
	}
	if counter(m1, "cohort_plugin_restarts_total") != 0 || m1["cohort_heartbeat_age_seconds"] == nil {
		t.Errorf("plugin restarts %v, heartbeat ages %v", m1["cohort_plugin_restarts_total"], m1["cohort_heartbeat_age_seconds"])
	}
	t.Logf("page: %d batches, %d round points, then %d, %d", first.Batches, first.RoundPoints, second.Batches, second.RoundPoints)

	victim := workerPID(t, p.cmd.Process.Pid, 2)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor("rank 2 dead", 10*time.Second, func(s pageState) bool { return s.Rank2 == "dead" })
	// The mock trainer reports its learning rate: a curve of it once an
	// epoch has finished; the controller's interval is in the header.
	waitFor("the lr scalar's curve and the sync interval", 30*time.Second, func(s pageState) bool {
		return s.Scalars["lr"] >= 1 && s.Interval != "–" && s.Interval != ""
	})
	time.Sleep(600 * time.Millisecond) // a poll after the timeline's redraw

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	shot, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	artifacts := os.Getenv("COHORT_TEST_ARTIFACTS")
	if artifacts == "" {
		artifacts = dir
	}
	shotPath := filepath.Join(artifacts, "status-page.png")
	if err := os.WriteFile(shotPath, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shotPath)

	if code := p.wait(60 * time.Second); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
}

func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s does not parse as Prometheus text: %v", url, err)
	}
	return fams
}

func counter(fams map[string]*dto.MetricFamily, name string) float64 {
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 {
		return -1
	}
	return f.GetMetric()[0].GetCounter().GetValue()
}
