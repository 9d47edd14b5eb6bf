package worker_test

import (
	"testing"

	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// A round the coordinator marks overlap, at a rank admitted for it whose
// trainer can, runs beside the plan in training: its SyncAck comes while
// the plan's batches still do, and the plan's Metrics say the round held
// training for a fraction of its length. A round not so marked waits for
// the plan's end and holds training for all of it.
func TestRoundBesideTraining(t *testing.T) {
	for _, tc := range []struct {
		name    string
		overlap bool
	}{{"overlapped", true}, {"blocking", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCoordinator(t)
			ts := trainerSettings()
			ts.SleepPerBatch = "25ms"
			o := c.options(0, 1, ts)
			inProcess(&o)
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "overlap", Seed: 3, OverlapRounds: true})
			expect[*wirepb.Ready](l)
			l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 160, 3, 256)}) // 10 batches
			l.send(&wirepb.StartEpoch{Plan: plan(0, 160, 32, 3, 256)})
			expect[*wirepb.Batch](l)
			l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, Overlap: tc.overlap})

			// The order of the frames that follow, up to the first plan's
			// Metrics and the round's SyncAck.
			var order []string
			var first *wirepb.Metrics
			var ack *wirepb.SyncAck
			batchesAfterAck := 0
			for first == nil || ack == nil {
				switch m := l.next(frameWait).(type) {
				case *wirepb.Batch:
					if ack != nil {
						batchesAfterAck++
					}
				case *wirepb.SnapshotReady:
					order = append(order, "snapshot")
				case *wirepb.SyncAck:
					ack = m
					order = append(order, "ack")
				case *wirepb.Metrics:
					if first == nil {
						first = m
						order = append(order, "metrics")
					}
				case nil:
					t.Fatalf("no more frames after %v", order)
				}
			}
			if ack.GetAborted() {
				t.Fatalf("round aborted: %v", ack)
			}
			if tc.overlap {
				if order[len(order)-1] != "metrics" || batchesAfterAck == 0 {
					t.Errorf("frames %v, %d batches after the ack: want the ack while the plan still trained", order, batchesAfterAck)
				}
				if held := first.GetRoundWaitMs(); held > 40 {
					t.Errorf("the round held training %.1f ms, more than a batch and a half", held)
				}
			} else if order[0] != "metrics" {
				t.Errorf("frames %v: a blocking round must wait for the plan's end", order)
			}
			var second *wirepb.Metrics
			for second == nil {
				switch m := l.next(frameWait).(type) {
				case *wirepb.Metrics:
					second = m
				case nil:
					t.Fatal("no Metrics for the second plan")
				}
			}
			if !tc.overlap && !(second.GetRoundWaitMs() > 0) {
				t.Errorf("a blocking round held nothing: %v", second)
			}
			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}
