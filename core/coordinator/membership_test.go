package coordinator

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/meeting"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// A rank lost mid-epoch (its link breaks, or it falls silent past the
// heartbeat timeout) is declared dead to the survivors, the group is
// re-formed without it, and its unfinished samples (those it trained since
// the last round included) are handed out with ExtendPartition, so the
// cohort's model still holds every sample of the epoch exactly once.
func TestDeadRankRedistributed(t *testing.T) {
	cases := []struct {
		name   string
		script rankScript
		reason string
	}{
		{"link breaks", rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3}, "link closed without Exiting"},
		{"link breaks, reports name no plan", rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3, anonymousReports: true}, "link closed without Exiting"},
		{"falls silent", rankScript{msPerBatch: 5 * time.Millisecond, silentAfterBatches: 3}, "silent for 1s (heartbeat timeout)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.HeartbeatTimeout = time.Second
			// A meeting point the ranks asked for must hear of the death
			// too (the scripted ranks average nothing).
			red := &fixedEndpoint{addr: "127.0.0.1:1"}
			h := newHarness(t, cfg, func(o *Options) {
				o.Meetings = map[string]meeting.Factory{"fabric": func(meeting.Env) (meeting.Point, error) { return red, nil }}
			})
			ranks := h.startAll(func(r uint32) rankScript {
				if r == 2 {
					tc.script.meet = "fabric"
					return tc.script
				}
				return rankScript{meet: "fabric", msPerBatch: 5 * time.Millisecond}
			})
			sum := h.mustComplete()
			h.ledger.checkExactlyOnce(t, 2, 96)
			red.mu.Lock()
			if !slices.Equal(red.dead, []uint32{2}) {
				t.Errorf("meeting point told of deaths %v, want [2]", red.dead)
			}
			red.mu.Unlock()

			if len(sum.MembershipEvents) != 1 {
				t.Fatalf("membership events %+v, want one", sum.MembershipEvents)
			}
			ev := sum.MembershipEvents[0]
			if ev.Rank != 2 || ev.Event != "dead" || ev.Epoch != 1 || ev.Reason != tc.reason {
				t.Errorf("event %+v, want rank 2 dead in epoch 1: %q", ev, tc.reason)
			}
			// One numbering of epochs: the log says what the summary does,
			// and counts from 1 as it does.
			if !h.logHas("rank removed from the cohort", "rank=2", "epoch=1") || !h.logHas("epoch started", "epoch=1") || h.logHas("epoch=0") {
				t.Errorf("the coordinator's log numbers epochs unlike the summary (from 1):\n%s", h.logs.String())
			}
			if r := sum.Ranks[2]; r.State != record.RankDead || r.Reason != tc.reason {
				t.Errorf("rank 2 summary %+v", r)
			}
			var extended uint64
			for _, f := range ranks[:2] {
				dd := messagesOf[*wirepb.DeclareDead](f)
				if len(dd) != 1 || dd[0].GetRank() != 2 {
					t.Errorf("rank %d DeclareDead %v, want one for rank 2", f.id, dd)
				}
				ns := messagesOf[*wirepb.NewSession](f)
				if len(ns) != 1 || ns[0].GetGeneration() != 1 || ns[0].GetNewWorldSize() != 2 ||
					ns[0].GetNewRank() != f.id || !slices.Equal(ns[0].GetMembers(), []uint32{0, 1}) ||
					string(ns[0].GetSessionId()) != "session-1-from-0" {
					t.Errorf("rank %d NewSession %v, want generation 1, members [0 1], its own new rank, rank 0's id", f.id, ns)
				}
				for _, e := range messagesOf[*wirepb.ExtendPartition](f) {
					extended += e.GetPartitionSize()
				}
			}
			// Rank 2 trained 3 batches of 8 of its 32, two of them averaged
			// in round 1: the third, which died with it, and the rest of
			// its second plan go to the others.
			if extended != 32-2*8 {
				t.Errorf("ExtendPartition covered %d samples, want %d", extended, 32-2*8)
			}
			if n := len(messagesOf[*wirepb.RequestSessionId](ranks[0])); n != 1 {
				t.Errorf("rank 0 (lowest survivor) got %d RequestSessionId, want 1", n)
			}
			if n := len(messagesOf[*wirepb.RequestSessionId](ranks[1])); n != 0 {
				t.Errorf("rank 1 got %d RequestSessionId, want 0", n)
			}
		})
	}
}

// When the epoch-callback rank dies, the lowest survivor takes the role
// and evaluates.
func TestCallbackRoleReElected(t *testing.T) {
	cfg := testConfig(t)
	cfg.Run.Epochs = 1
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(r uint32) rankScript {
		if r == 0 {
			return rankScript{msPerBatch: 2 * time.Millisecond, dieAfterBatches: 1}
		}
		return rankScript{msPerBatch: 2 * time.Millisecond}
	})
	h.mustComplete()
	h.ledger.checkExactlyOnce(t, 1, 96)
	roles := messagesOf[*wirepb.SetEpochCallbackRole](ranks[2])
	if len(roles) != 2 || roles[1].GetRank() != 1 {
		t.Errorf("rank 2 roles %v, want rank 0 then rank 1", roles)
	}
	if ev := messagesOf[*wirepb.Evaluate](ranks[1]); len(ev) != 1 || ev[0].GetTargetRank() != 1 {
		t.Errorf("rank 1 Evaluate %v, want one targeting it", ev)
	}
	if rq := messagesOf[*wirepb.RequestSessionId](ranks[1]); len(rq) != 1 {
		t.Errorf("rank 1 (lowest survivor) RequestSessionId %v", rq)
	}
}

// A death during a round: the round runs again under a new number on the
// re-formed group, as AVERAGE when every survivor aborted and as a
// BROADCAST from the lowest survivor that completed otherwise.
func TestRoundReissuedAfterDeath(t *testing.T) {
	cases := []struct {
		name   string
		script func(r uint32) rankScript
		mode   wirepb.SyncMode
		root   uint32
	}{
		{
			name: "every survivor aborted",
			script: func(r uint32) rankScript {
				if r == 2 {
					return rankScript{dieOnRound: 1, dieOnRoundSet: true}
				}
				return rankScript{}
			},
			mode: wirepb.SyncMode_SYNC_MODE_AVERAGE,
		},
		{
			// Rank 2 enters the collective and dies; rank 0 completes, rank
			// 1 sees the death first and aborts.
			name: "one survivor completed",
			script: func(r uint32) rankScript {
				switch r {
				case 2:
					return rankScript{dieOnRound: 1, dieOnRoundSet: true, enterFirst: true}
				case 1:
					return rankScript{abortRound: 1, abortRoundSet: true}
				}
				return rankScript{}
			},
			mode: wirepb.SyncMode_SYNC_MODE_BROADCAST,
			root: 0,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Epochs = 1
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(tc.script)
			h.mustComplete()
			h.ledger.checkExactlyOnce(t, 1, 96)
			for _, f := range ranks[:2] {
				syncs := messagesOf[*wirepb.Sync](f)
				if len(syncs) < 3 {
					t.Fatalf("rank %d syncs %v", f.id, syncs)
				}
				again := syncs[2]
				if again.GetRound() != 2 || again.GetMode() != tc.mode || again.GetRoot() != tc.root {
					t.Errorf("rank %d: round after the abort is %v, want round 2 %v root %d", f.id, again, tc.mode, tc.root)
				}
				// NewSession must reach the rank before the round that runs
				// on the new group.
				var order []string
				for _, m := range messagesOf[proto.Message](f) {
					switch v := m.(type) {
					case *wirepb.NewSession:
						order = append(order, "session")
					case *wirepb.Sync:
						if v.GetRound() == 2 {
							order = append(order, "round2")
						}
					}
				}
				if !slices.Equal(order, []string{"session", "round2"}) {
					t.Errorf("rank %d: order %v, want NewSession before round 2", f.id, order)
				}
			}
		})
	}
}

// Fewer survivors than min_ranks: ShutdownWithSave, a complete
// checkpoint from the survivors, status failed.
func TestTooFewRanksSaves(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.MinRanks = 3
	h := newHarness(t, cfg, nil)
	ranks := h.startAll(func(r uint32) rankScript {
		if r == 1 {
			return rankScript{msPerBatch: 2 * time.Millisecond, dieAfterBatches: 5}
		}
		return rankScript{msPerBatch: 2 * time.Millisecond}
	})
	sum, err := h.wait()
	if err == nil || sum.Status != record.StatusFailed || !strings.Contains(err.Error(), "min_ranks is 3") {
		t.Fatalf("status %s, error %v", statusOf(sum), err)
	}
	for _, f := range []*fakeRank{ranks[0], ranks[2]} {
		sw := messagesOf[*wirepb.ShutdownWithSave](f)
		if len(sw) != 1 || sw[0].GetReason() != wirepb.ShutdownReason_SHUTDOWN_REASON_TOO_FEW_RANKS {
			t.Errorf("rank %d ShutdownWithSave %v", f.id, sw)
		}
		if n := len(messagesOf[*wirepb.ExtendPartition](f)); n != 0 {
			t.Errorf("rank %d got %d ExtendPartition; a stopping run redistributes nothing", f.id, n)
		}
	}
	if sum.Checkpoint == "" {
		t.Fatal("no checkpoint in the summary")
	}
	m, err := checkpoint.ReadMeta(sum.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if m.Reason != checkpoint.ReasonTooFewRanks || !slices.Equal(m.SavedRanks, []uint32{0, 2}) {
		t.Errorf("meta reason %q, saved %v", m.Reason, m.SavedRanks)
	}
	for _, r := range m.SavedRanks {
		if _, err := os.Stat(filepath.Join(sum.Checkpoint, "rank-"+string(rune('0'+r)), "state.json")); err != nil {
			t.Errorf("rank %d state: %v", r, err)
		}
	}
}

// TestSessionRequestRetried: after a death the lowest survivor is asked
// for the new session id; when it does not answer within SessionTimeout
// the next survivor is asked, and the run completes on its id.
func TestSessionRequestRetried(t *testing.T) {
	cfg := testConfig(t)
	cfg.Coordinator.HeartbeatTimeout = time.Second
	h := newHarness(t, cfg, func(o *Options) { o.SessionTimeout = 300 * time.Millisecond })
	ranks := h.startAll(func(r uint32) rankScript {
		switch r {
		case 0:
			return rankScript{msPerBatch: 5 * time.Millisecond, ignoreSessionRequest: true}
		case 2:
			return rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3}
		}
		return rankScript{msPerBatch: 5 * time.Millisecond}
	})
	h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, 96)
	if !h.logHas("session id request timed out; asking the next survivor", "rank=1") {
		t.Error("no retry with rank 1 in the log")
	}
	for _, f := range ranks[:2] {
		var ids []string
		for _, m := range messagesOf[*wirepb.NewSession](f) {
			ids = append(ids, string(m.GetSessionId()))
		}
		if len(ids) == 0 || ids[len(ids)-1] != "session-1-from-1" {
			t.Errorf("rank %d's NewSession ids %v, want the one rank 1 made", f.id, ids)
		}
	}
}

// The summary counts every sample of an epoch once, whatever died when:
// batches a dead rank reported that a round averaged count though no
// Metrics closes their plan; the ones that died with it count only when a
// survivor trains them again.
func TestEpochSummaryCountsADeadRanksTrainedBatches(t *testing.T) {
	cases := []struct {
		name   string
		script rankScript
	}{
		{"dies after its first batch", rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 1}},
		{"dies mid-window", rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3}},
		{"dies mid-window, reports name no plan", rankScript{msPerBatch: 5 * time.Millisecond, dieAfterBatches: 3, anonymousReports: true}},
		{"exits mid-window", rankScript{msPerBatch: 5 * time.Millisecond, exitAfterBatches: 3}},
		{"falls silent mid-window", rankScript{msPerBatch: 5 * time.Millisecond, silentAfterBatches: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.HeartbeatTimeout = time.Second
			h := newHarness(t, cfg, nil)
			h.startAll(func(r uint32) rankScript {
				if r == 2 {
					return tc.script
				}
				return rankScript{msPerBatch: 5 * time.Millisecond}
			})
			sum := h.mustComplete()
			h.ledger.checkExactlyOnce(t, 2, 96)
			if len(sum.Epochs) != 2 {
				t.Fatalf("%d epochs in the summary, want 2", len(sum.Epochs))
			}
			for _, e := range sum.Epochs {
				var perRank uint64
				for _, r := range e.Ranks {
					perRank += r.Samples
				}
				if e.Samples != 96 || perRank != 96 {
					t.Errorf("epoch %d: %d samples (ranks' shares sum to %d), want 96", e.Epoch, e.Samples, perRank)
				}
				if e.Loss != 0.5 {
					t.Errorf("epoch %d: loss %v, want 0.5 (every batch reported 0.5)", e.Epoch, e.Loss)
				}
			}
		})
	}
}
