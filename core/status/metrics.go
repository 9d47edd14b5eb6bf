package status

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// collector turns the latest Snapshot into metrics at each scrape: the
// loop keeps plain counters, and nothing here holds state of its own.
type collector struct {
	src Source

	rounds, roundSeconds, bytes, batches, samples, deaths, restarts *prometheus.Desc
	rate, alive, world, epoch, hbAge, scalar                        *prometheus.Desc
	interval, lrScale, divergence                                   *prometheus.Desc
}

func newCollector(src Source) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("cohort_"+name, help, labels, nil)
	}
	return &collector{
		src:          src,
		rounds:       d("rounds_total", "Averaging rounds completed."),
		roundSeconds: d("round_duration_seconds", "Averaging round time, from Sync to the last SyncAck."),
		bytes:        d("averaged_bytes_total", "Averaging data that crossed the network, as the ranks report it."),
		batches:      d("batches_total", "Batches trained, all ranks."),
		samples:      d("samples_total", "Samples trained, all ranks."),
		deaths:       d("rank_deaths_total", "Ranks lost from the cohort (link broken, silent, not reading)."),
		restarts:     d("plugin_restarts_total", "Plugin processes replaced after a failure."),
		rate:         d("samples_per_second", "Training rate over about the last second."),
		alive:        d("ranks_alive", "Ranks live in the cohort."),
		world:        d("ranks", "The run's world size."),
		epoch:        d("epoch", "The epoch in training."),
		hbAge:        d("heartbeat_age_seconds", "Time since each connected rank's last frame.", "rank"),
		scalar:       d("trainer_scalar", "Each trainer scalar's mean over the last finished epoch.", "name"),
		interval:     d("sync_interval_batches", "The controller's sync interval in force."),
		lrScale:      d("lr_scale", "The controller's learning-rate multiplier in force."),
		divergence:   d("divergence", "Running mean of the ranks' distance from the average, relative to its norm."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.rounds, c.roundSeconds, c.bytes, c.batches, c.samples, c.deaths,
		c.restarts, c.rate, c.alive, c.world, c.epoch, c.hbAge, c.scalar, c.interval, c.lrScale, c.divergence} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src()
	if s == nil {
		return
	}
	s = s.at(time.Now())
	t := s.Totals
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(c.rounds, float64(t.Rounds))
	counter(c.bytes, t.BytesAveraged)
	counter(c.batches, float64(t.Batches))
	counter(c.samples, float64(t.Samples))
	counter(c.deaths, float64(t.Deaths))
	counter(c.restarts, float64(t.PluginRestarts))
	gauge(c.rate, s.SamplesPerSecond)
	gauge(c.alive, float64(s.Live))
	gauge(c.world, float64(s.World))
	gauge(c.epoch, float64(s.Epoch))
	gauge(c.interval, float64(s.Controller.Interval))
	gauge(c.lrScale, s.Controller.LRScale)
	gauge(c.divergence, s.Controller.DivergenceEMA)
	for _, r := range s.Ranks {
		if r.HeartbeatAge != nil {
			gauge(c.hbAge, *r.HeartbeatAge, strconv.FormatUint(uint64(r.Rank), 10))
		}
	}
	if n := len(s.EpochCurve); n > 0 {
		for name, v := range s.EpochCurve[n-1].Scalars {
			gauge(c.scalar, v, name)
		}
	}
	h := s.RoundSeconds
	buckets := make(map[float64]uint64, len(h.Bounds))
	for i := range min(len(h.Bounds), len(h.Counts)) {
		buckets[h.Bounds[i]] = h.Counts[i]
	}
	ch <- prometheus.MustNewConstHistogram(c.roundSeconds, h.Count, h.Sum, buckets)
}
