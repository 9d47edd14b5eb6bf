package averager

import (
	"context"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/reduceserver"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// ConformanceOptions are the suite's options for this averager: a reduce
// server per cohort, the plain mean the suite checks (smoothing off), and
// settings for gamma 2 and for an outer optimizer (whose state SaveState
// keeps).
func ConformanceOptions() []conformance.AveragerOption {
	return []conformance.AveragerOption{
		conformance.MeetingPoint(meetingPoint),
		conformance.Settings([]byte(`{"smoothing": 0, "timeout": "5s"}`)),
		conformance.Gamma(2, []byte(`{"gamma": 2, "smoothing": 0, "timeout": "5s"}`)),
		conformance.Stateful([]byte(`{"outer": "slowmo", "timeout": "5s"}`)),
	}
}

// meetingPoint starts the coordinator's reduce server for one cohort.
func meetingPoint(t conformance.T, world uint32, layout arena.Layout) conformance.Meeting {
	srv, err := reduceserver.Listen(context.Background(), reduceserver.Config{
		Addr: "127.0.0.1:0", Key: testKey, RunID: testRun, World: world, Layout: &layout, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("reduce server: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return conformance.Meeting{Endpoint: srv.Addr(), DataKey: testKey, RunID: testRun, MarkDead: srv.MarkDead}
}

func TestConformance(t *testing.T) {
	conformance.RunAverager(t, func(conformance.T) (plugin.Averager, error) { return New(nil), nil }, ConformanceOptions()...)
}
