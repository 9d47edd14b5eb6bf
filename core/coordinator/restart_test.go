package coordinator

import (
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
)

// A rank that replaced a plugin is recorded as such, not as a death or a
// departure: in the summary, its rank's count, and the status snapshot.
func TestPluginRestartRecorded(t *testing.T) {
	cfg := testConfig(t)
	h := newHarness(t, cfg, nil)
	h.startAll(func(r uint32) rankScript {
		s := rankScript{msPerBatch: time.Millisecond}
		if r == 1 {
			s.restartAfterBatches = 2
		}
		return s
	})
	sum := h.mustComplete()
	h.ledger.checkExactlyOnce(t, 2, 96)
	if len(sum.MembershipEvents) != 1 || sum.MembershipEvents[0].Event != record.EventPluginRestarted || sum.MembershipEvents[0].Rank != 1 {
		t.Fatalf("membership events %+v, want one plugin_restarted of rank 1", sum.MembershipEvents)
	}
	if sum.Ranks[1].PluginRestarts != 1 || sum.Ranks[1].State != record.RankExited || sum.Ranks[0].PluginRestarts != 0 {
		t.Errorf("ranks %+v, want rank 1 exited with one plugin restart", sum.Ranks)
	}
	st := h.coord.Status()
	if st == nil || st.Totals.PluginRestarts != 1 || st.Totals.Deaths != 0 || st.Totals.Departures != 0 || st.Ranks[1].PluginRestarts != 1 {
		t.Errorf("status totals %+v, want one plugin restart and no death or departure", st)
	}
}
