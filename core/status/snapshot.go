// Package status serves a run's live status to operators: the status page
// (HTML, CSS and a script embedded in the binary), its JSON API at
// /api/v1/status and Prometheus metrics at /metrics, all read from an
// immutable Snapshot the coordinator publishes; and it draws a finished
// run's curves (curves.png). docs/operations.md documents every field.
package status

import "time"

// Snapshot is the run as the coordinator's loop last published it. It is
// never modified once published: handlers read it without locks.
type Snapshot struct {
	RunID    string `json:"run_id"`
	Status   string `json:"status"` // the phase while running, then completed | failed | stopped
	Error    string `json:"error,omitempty"`
	Policy   string `json:"policy"`
	Trainer  string `json:"trainer"`
	Averager string `json:"averager"`
	// Time is when the loop published this snapshot.
	Time    time.Time `json:"time"`
	Started time.Time `json:"started"`
	World   int       `json:"world"`
	Live    int       `json:"live"`
	// Epoch is the epoch in training; Epochs the run's total.
	Epoch      uint64 `json:"epoch"`
	Epochs     int    `json:"epochs"`
	EpochDone  uint64 `json:"epoch_samples_done"`
	EpochTotal uint64 `json:"epoch_samples_total"`
	GlobalStep uint64 `json:"global_step"`
	// SamplesPerSecond is the cohort's training rate over about the last
	// second.
	SamplesPerSecond float64 `json:"samples_per_second"`
	Totals           Totals  `json:"totals"`
	Ranks            []Rank  `json:"ranks"`
	// EpochCurve holds the finished epochs, thinned beyond 1,024 to
	// those at multiples of 2, 4, 8… and the latest; RoundCurve the last
	// MaxRounds averaging rounds.
	EpochCurve []EpochPoint `json:"epoch_curve"`
	RoundCurve []RoundPoint `json:"round_curve"`
	Membership []Membership `json:"membership"`
	// Controller is the coordinator's controller: the interval and
	// learning-rate scale in force and its latest decisions.
	Controller Controller `json:"controller"`
	// RoundSeconds is the histogram of round durations, for /metrics.
	RoundSeconds Histogram `json:"-"`
}

// MaxRounds bounds Snapshot.RoundCurve.
const MaxRounds = 500

// Totals are the run's counters since this process started.
type Totals struct {
	Rounds         uint64  `json:"rounds"`
	RoundSeconds   float64 `json:"round_seconds"`
	BytesAveraged  float64 `json:"bytes_averaged"`
	Batches        uint64  `json:"batches"`
	Samples        uint64  `json:"samples"`
	Deaths         uint64  `json:"deaths"`
	Departures     uint64  `json:"departures"`
	PluginRestarts uint64  `json:"plugin_restarts"`
}

// Rank is one rank's place in the run.
type Rank struct {
	Rank   uint32 `json:"rank"`
	State  string `json:"state"` // absent | joined | ready | live | exited | dead
	Reason string `json:"reason,omitempty"`
	// Epoch is the epoch of the rank's last batch report; Batches and
	// Samples count its batches in this run.
	Epoch   uint64  `json:"epoch"`
	Batches uint64  `json:"batches"`
	Samples uint64  `json:"samples"`
	BatchMS float64 `json:"batch_ms"`
	// LastHeard is the rank's last frame; HeartbeatAge is its age when the
	// snapshot was served (Serve fills it in) while the rank is connected.
	// Both are absent for a rank not heard from, or, for the age, no
	// longer connected: unknown, not zero.
	LastHeard    time.Time  `json:"last_heard,omitzero"`
	HeartbeatAge *float64   `json:"heartbeat_age_seconds,omitempty"`
	Resources    *Resources `json:"resources,omitempty"`
	// PluginRestarts counts the plugins the rank replaced after they died
	// or wedged.
	PluginRestarts uint32 `json:"plugin_restarts"`
}

// Resources is a rank's last ResourceSample.
type Resources struct {
	Time           time.Time `json:"time"`
	HostCPUPercent *float32  `json:"host_cpu_percent,omitempty"`
	HostRAMUsed    *uint64   `json:"host_ram_used_bytes,omitempty"`
	HostRAMTotal   *uint64   `json:"host_ram_total_bytes,omitempty"`
	Processes      []Process `json:"processes"`
	GPUs           []GPU     `json:"gpus"`
}

// Process is one of a rank's processes: its worker core or a plugin.
type Process struct {
	Role       string   `json:"role"`
	Name       string   `json:"name,omitempty"`
	PID        int32    `json:"pid"`
	CPUPercent *float32 `json:"cpu_percent,omitempty"` // of one core
	RSS        *uint64  `json:"rss_bytes,omitempty"`
}

// GPU is one device as NVML reads it on the rank's host.
type GPU struct {
	Index       uint32   `json:"index"`
	Name        string   `json:"name"`
	UtilPercent *float32 `json:"util_percent,omitempty"`
	MemUsed     *uint64  `json:"memory_used_bytes,omitempty"`
	MemTotal    *uint64  `json:"memory_total_bytes,omitempty"`
}

// EpochPoint is one finished epoch.
type EpochPoint struct {
	Epoch    uint64   `json:"epoch"`
	Loss     float64  `json:"loss"`
	EvalLoss *float64 `json:"eval_loss,omitempty"`
	Accuracy *float64 `json:"accuracy,omitempty"`
	Seconds  float64  `json:"seconds"`
	Samples  uint64   `json:"samples"`
	Rounds   uint64   `json:"rounds"`
	// Scalars are the trainer's named figures, each its mean over the
	// epoch; the coordinator keeps few (plugin.MaxScalars), as each is a
	// metric's label value.
	Scalars map[string]float64 `json:"scalars,omitempty"`
}

// RoundPoint is one completed averaging round.
type RoundPoint struct {
	Round uint64 `json:"round"`
	Epoch uint64 `json:"epoch"`
	// Loss is the mean training loss of the batches since the previous
	// round; absent when none reported a finite one.
	Loss    *float64  `json:"loss,omitempty"`
	Seconds float64   `json:"seconds"`
	Bytes   float64   `json:"bytes"`
	Time    time.Time `json:"time"`
}

// MaxDecisions bounds Controller.Decisions.
const MaxDecisions = 20

// Controller is what the controller has in force and what it last did.
type Controller struct {
	Adaptive bool `json:"adaptive"`
	// Interval is the sync interval in batches (under cadence, the
	// cadence sizes windows and this stays the configured one).
	Interval      uint64  `json:"interval"`
	LRScale       float64 `json:"lr_scale"`
	Guard         bool    `json:"guard"`
	DivergenceEMA float64 `json:"divergence_ema"`
	Throttles     uint64  `json:"throttles"`
	// Decisions are the last MaxDecisions changes, oldest first.
	Decisions []Decision `json:"decisions"`
}

// Decision is one change the controller made.
type Decision struct {
	Round      uint64  `json:"round"`
	Epoch      uint64  `json:"epoch"`
	Rule       string  `json:"rule"`
	Divergence float64 `json:"divergence,omitempty"`
	From       uint64  `json:"interval_from"`
	To         uint64  `json:"interval_to"`
	LRFrom     float64 `json:"lr_scale_from"`
	LRTo       float64 `json:"lr_scale_to"`
}

// Membership is a change of the cohort.
type Membership struct {
	Rank   uint32    `json:"rank"`
	Event  string    `json:"event"` // dead | left
	Epoch  uint64    `json:"epoch"`
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// Histogram is a cumulative histogram: Counts[i] observations at most
// Bounds[i], as Prometheus keeps one.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Sum    float64
	Count  uint64
}

// RoundBounds are the round-duration buckets, in seconds.
var RoundBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// NewHistogram is an empty histogram over bounds.
func NewHistogram(bounds []float64) Histogram {
	return Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds))}
}

// Observe adds v.
func (h *Histogram) Observe(v float64) {
	for i, b := range h.Bounds {
		if v <= b {
			h.Counts[i]++
		}
	}
	h.Sum += v
	h.Count++
}

// Clone is a copy that later Observes on h leave alone.
func (h Histogram) Clone() Histogram {
	h.Counts = append([]uint64(nil), h.Counts...)
	return h
}

// at is s as served at now: each rank's heartbeat age filled in, on a copy.
func (s *Snapshot) at(now time.Time) *Snapshot {
	c := *s
	c.Ranks = make([]Rank, len(s.Ranks))
	for i, r := range s.Ranks {
		if !r.LastHeard.IsZero() && (r.State == "joined" || r.State == "ready" || r.State == "live") {
			age := max(0, now.Sub(r.LastHeard).Seconds())
			r.HeartbeatAge = &age
		}
		c.Ranks[i] = r
	}
	return &c
}
