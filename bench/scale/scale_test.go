package main

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// The harness runs its coordinator as this binary again.
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	os.Exit(m.Run())
}

// A small run end to end: every rank forms, trains an epoch and exits, and
// both kinds of death are detected, each within the liveness timeout.
func TestSmallRun(t *testing.T) {
	o := options{
		epochs:    1,
		syncEvery: 2,
		windows:   3,
		batch:     4,
		batchTime: 20 * time.Millisecond,
		heartbeat: 200 * time.Millisecond,
		hbTimeout: time.Second,
		killPct:   1,
		killAfter: 2,
		timeout:   30 * time.Second,
	}
	res, err := runSize(context.Background(), o, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *res)
	if res.Deaths != 2 || res.CloseDetectMaxS <= 0 || res.SilentDetectMaxS <= 0 {
		t.Errorf("deaths %d, detected after %.2fs (closed) and %.2fs (silent): want both kinds detected",
			res.Deaths, res.CloseDetectMaxS, res.SilentDetectMaxS)
	}
	if res.SilentDetectMaxS > o.hbTimeout.Seconds()+1 {
		t.Errorf("the silent rank was detected after %.2fs, over the %v timeout + 1 s", res.SilentDetectMaxS, o.hbTimeout)
	}
	if res.SilentDetectMaxS < o.hbTimeout.Seconds()-o.heartbeat.Seconds()-0.1 {
		t.Errorf("the silent rank was detected after %.2fs, before the %v timeout could fire: not the timeout path", res.SilentDetectMaxS, o.hbTimeout)
	}
	if res.Rounds < 3 || res.Heartbeats == 0 || res.FormationS <= 0 || res.CoordinatorCPUS <= 0 || res.CoordinatorRSSMB <= 0 {
		t.Errorf("missing figures: %+v", *res)
	}
}

func TestVictims(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want int
	}{{10, 2}, {100, 2}, {1000, 10}, {3, 2}, {2, 1}} {
		v := victimsOf(tc.n, 1)
		seen := map[uint32]bool{}
		for _, id := range v {
			if id == 0 || int(id) >= tc.n || seen[id] {
				t.Errorf("n=%d: victims %v: rank 0, out of range or repeated", tc.n, v)
			}
			seen[id] = true
		}
		if len(v) != tc.want {
			t.Errorf("n=%d: %d victims, want %d", tc.n, len(v), tc.want)
		}
	}
}
