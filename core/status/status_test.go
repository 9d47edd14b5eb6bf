package status

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func testSnapshot(now time.Time) *Snapshot {
	cpu := float32(150)
	rss := uint64(1 << 20)
	h := NewHistogram(RoundBounds)
	h.Observe(0.003)
	h.Observe(0.2)
	return &Snapshot{
		RunID: "r1", Status: "training", World: 3, Live: 2, Epoch: 1, Epochs: 3, Time: now,
		Totals: Totals{Rounds: 2, RoundSeconds: 0.203, BytesAveraged: 4096, Batches: 40, Samples: 640, Deaths: 1},
		Ranks: []Rank{
			{Rank: 0, State: "live", LastHeard: now.Add(-1500 * time.Millisecond), Resources: &Resources{
				Processes: []Process{{Role: "worker", PID: 10, CPUPercent: &cpu, RSS: &rss}, {Role: "trainer", Name: "mock", PID: 11}}}},
			{Rank: 1, State: "live", LastHeard: now.Add(-200 * time.Millisecond)},
			{Rank: 2, State: "dead", Reason: "link closed without Exiting", LastHeard: now.Add(-time.Minute)},
		},
		// Only the last finished epoch's scalars are metrics.
		EpochCurve: []EpochPoint{
			{Epoch: 1, Scalars: map[string]float64{"lr": 0.1, "old": 1}},
			{Epoch: 2, Scalars: map[string]float64{"lr": 0.05, "grad/norm": 2.5}},
		},
		Controller: Controller{Adaptive: true, Interval: 5, LRScale: 0.5, Guard: true, DivergenceEMA: 0.02,
			Decisions: []Decision{{Round: 7, Epoch: 1, Rule: "guard", Divergence: 0.2, From: 10, To: 5, LRFrom: 1, LRTo: 0.5}}},
		RoundSeconds: h,
	}
}

// TestStatusJSON: the API serves the snapshot under its documented names,
// with heartbeat ages at the time of the request for connected ranks only,
// and leaves the published snapshot as it was.
func TestStatusJSON(t *testing.T) {
	snap := testSnapshot(time.Now())
	srv := httptest.NewServer(Handler(func() *Snapshot { return snap }))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var got map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"run_id", "status", "world", "live", "epoch", "epochs", "totals", "ranks", "epoch_curve", "round_curve", "membership", "samples_per_second", "controller"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %q in %v", k, got)
		}
	}
	ranks := got["ranks"].([]any)
	if a, _ := ranks[0].(map[string]any)["heartbeat_age_seconds"].(float64); a < 1.5 || a > 10 {
		t.Errorf("rank 0 heartbeat age %v, want about 1.5 s", a)
	}
	// Unknown figures are absent, not zero: a dead rank's heartbeat age,
	// and both for a rank never heard from.
	if v, ok := ranks[2].(map[string]any)["heartbeat_age_seconds"]; ok {
		t.Errorf("dead rank's heartbeat age %v, want it absent", v)
	}
	absent, err := json.Marshal(Rank{Rank: 3, State: "absent"})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(absent); strings.Contains(s, "last_heard") || strings.Contains(s, "heartbeat_age") {
		t.Errorf("a rank never heard from: %s, want no last_heard or heartbeat age", s)
	}
	procs := ranks[0].(map[string]any)["resources"].(map[string]any)["processes"].([]any)
	if len(procs) != 2 || procs[1].(map[string]any)["role"] != "trainer" || procs[0].(map[string]any)["cpu_percent"] != 150.0 {
		t.Errorf("processes %v", procs)
	}
	if snap.Ranks[0].HeartbeatAge != nil {
		t.Error("serving wrote into the published snapshot")
	}
	ctl := got["controller"].(map[string]any)
	if ctl["interval"] != 5.0 || ctl["lr_scale"] != 0.5 || ctl["guard"] != true || len(ctl["decisions"].([]any)) != 1 {
		t.Errorf("controller %v", ctl)
	}
	epochs := got["epoch_curve"].([]any)
	if sc := epochs[1].(map[string]any)["scalars"].(map[string]any); sc["lr"] != 0.05 || sc["grad/norm"] != 2.5 {
		t.Errorf("epoch 2's scalars %v", sc)
	}
}

func TestStatusBeforeTheRun(t *testing.T) {
	srv := httptest.NewServer(Handler(func() *Snapshot { return nil }))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d before the first snapshot, want 503", resp.StatusCode)
	}
}

// TestPageIsEmbedded: the page and its assets come from the binary.
func TestPageIsEmbedded(t *testing.T) {
	srv := httptest.NewServer(Handler(func() *Snapshot { return nil }))
	defer srv.Close()
	for path, want := range map[string]string{"/": `id="decisions"`, "/app.js": "api/v1/status", "/style.css": "td.state.dead"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d, %d bytes, want %q in it", path, resp.StatusCode, len(b), want)
		}
		// The SVG namespace is a name, not a fetch.
		if body := strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", ""); strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			t.Errorf("%s refers to another site", path)
		}
	}
}

// TestMetrics: /metrics parses as Prometheus text and says what the
// snapshot does, with a rank label on heartbeat age and a name label on
// the last epoch's trainer scalars alone.
func TestMetrics(t *testing.T) {
	snap := testSnapshot(time.Now())
	srv := httptest.NewServer(Handler(func() *Snapshot { return snap }))
	defer srv.Close()
	fams := scrape(t, srv.URL+"/metrics")
	for name, want := range map[string]float64{
		"cohort_rounds_total": 2, "cohort_averaged_bytes_total": 4096, "cohort_batches_total": 40,
		"cohort_samples_total": 640, "cohort_rank_deaths_total": 1, "cohort_plugin_restarts_total": 0,
		"cohort_ranks_alive": 2, "cohort_ranks": 3, "cohort_epoch": 1,
		"cohort_sync_interval_batches": 5, "cohort_lr_scale": 0.5, "cohort_divergence": 0.02,
	} {
		f := fams[name]
		if f == nil || len(f.Metric) != 1 {
			t.Errorf("%s: %v", name, f)
			continue
		}
		m := f.Metric[0]
		v := m.GetGauge().GetValue()
		if m.Counter != nil {
			v = m.GetCounter().GetValue()
		}
		if v != want || len(m.Label) != 0 {
			t.Errorf("%s = %v %v, want %v unlabelled", name, v, m.Label, want)
		}
	}
	hb := fams["cohort_heartbeat_age_seconds"]
	if hb == nil || len(hb.Metric) != 2 {
		t.Fatalf("heartbeat ages %v, want the two live ranks'", hb)
	}
	got := map[string]float64{}
	for _, m := range fams["cohort_trainer_scalar"].GetMetric() {
		if l := m.GetLabel(); len(l) == 1 && l[0].GetName() == "name" {
			got[l[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if want := map[string]float64{"lr": 0.05, "grad/norm": 2.5}; !maps.Equal(got, want) {
		t.Errorf("trainer scalars %v, want the last epoch's %v", got, want)
	}
	h := fams["cohort_round_duration_seconds"].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 0.2 {
		t.Errorf("round histogram count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
	}
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}
