package coordinator

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire/wirepb"
)

// The eval role follows coordinator.eval_rank: the lowest live rank, the
// fastest one (moving only for a rank at least 10% faster), or a fixed
// rank with the lowest live one standing in; when its rank dies the policy
// picks again among the survivors. The role's rank evaluates every epoch,
// every rank hears each move, and summary.json lists them.
func TestEvalRoleElection(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x * float64(time.Millisecond))
		}
		return out
	}
	// Three ranks of four batches an epoch: dieAfterBatches 1 dies in the
	// first epoch, 6 in the second.
	for _, tc := range []struct {
		name     string
		evalRank string
		batch    []time.Duration
		die      map[uint32]int // rank -> dieAfterBatches
		roles    []record.RoleElection
		evalOn   []uint32 // the rank that evaluated each epoch
	}{
		{"lowest keeps rank 0 though rank 2 is faster", config.EvalRankLowest, ms(10, 10, 8), nil,
			[]record.RoleElection{{Epoch: 1, Rank: 0, Why: record.RoleFormed}}, []uint32{0, 0}},
		{"fastest: a 5% faster rank does not take it", config.EvalRankFastest, ms(10, 10, 9.5), nil,
			[]record.RoleElection{{Epoch: 1, Rank: 0, Why: record.RoleFormed}}, []uint32{0, 0}},
		{"fastest: a 20% faster rank takes it at the first epoch's end", config.EvalRankFastest, ms(10, 10, 8), nil,
			[]record.RoleElection{{Epoch: 1, Rank: 0, Why: record.RoleFormed}, {Epoch: 1, Rank: 2, Why: record.RoleFaster}}, []uint32{2, 2}},
		{"fixed rank", "2", ms(10, 10, 10), nil,
			[]record.RoleElection{{Epoch: 1, Rank: 2, Why: record.RoleFormed}}, []uint32{2, 2}},
		{"fixed rank dead: the lowest live stands in", "2", ms(10, 10, 10), map[uint32]int{2: 1},
			[]record.RoleElection{{Epoch: 1, Rank: 2, Why: record.RoleFormed}, {Epoch: 1, Rank: 0, Why: record.RoleLost}}, []uint32{0, 0}},
		{"lowest holder dead: the next lowest", config.EvalRankLowest, ms(10, 10, 10), map[uint32]int{0: 1},
			[]record.RoleElection{{Epoch: 1, Rank: 0, Why: record.RoleFormed}, {Epoch: 1, Rank: 1, Why: record.RoleLost}}, []uint32{1, 1}},
		{"fastest holder dead: the fastest survivor", config.EvalRankFastest, ms(10, 9, 8), map[uint32]int{2: 6},
			[]record.RoleElection{{Epoch: 1, Rank: 0, Why: record.RoleFormed}, {Epoch: 1, Rank: 2, Why: record.RoleFaster}, {Epoch: 2, Rank: 1, Why: record.RoleLost}}, []uint32{2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Coordinator.EvalRank = tc.evalRank
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(func(r uint32) rankScript {
				return rankScript{msPerBatch: tc.batch[r], dieAfterBatches: tc.die[r]}
			})
			sum := h.mustComplete()
			h.ledger.checkExactlyOnce(t, 2, 96)

			if !reflect.DeepEqual(sum.Roles, tc.roles) {
				t.Errorf("summary roles %+v, want %+v", sum.Roles, tc.roles)
			}
			evalOn := make([]int64, cfg.Run.Epochs)
			for i := range evalOn {
				evalOn[i] = -1
			}
			for _, f := range ranks {
				for _, e := range messagesOf[*wirepb.Evaluate](f) {
					if e.GetTargetRank() != f.id || e.GetEpoch() >= uint64(len(evalOn)) || evalOn[e.GetEpoch()] >= 0 {
						t.Errorf("rank %d got Evaluate %v", f.id, e)
						continue
					}
					evalOn[e.GetEpoch()] = int64(f.id)
				}
			}
			for e, want := range tc.evalOn {
				if evalOn[e] != int64(want) {
					t.Errorf("epoch %d evaluated on rank %d, want %d", e+1, evalOn[e], want)
				}
			}
			// Rank 1 lives through every case: it heard each holder in turn.
			var heard, want []uint32
			for _, m := range messagesOf[*wirepb.SetEpochCallbackRole](ranks[1]) {
				heard = append(heard, m.GetRank())
			}
			for _, e := range tc.roles {
				want = append(want, e.Rank)
			}
			if !slices.Equal(heard, want) {
				t.Errorf("rank 1 heard SetEpochCallbackRole %v, want %v", heard, want)
			}
			if moves := len(tc.roles) - 1; moves > 0 && !h.logHas("eval role moved", "why="+tc.roles[moves].Why) {
				t.Errorf("no \"eval role moved\" log line for %+v", tc.roles[moves])
			}
			// The trained model comes from the last epoch's evaluator.
			last := tc.evalOn[len(tc.evalOn)-1]
			if n := len(messagesOf[*wirepb.Checkpoint](ranks[last])); n != 1 {
				t.Errorf("rank %d got %d Checkpoint frames, want the model export", last, n)
			}
		})
	}
}

// eval_every N evaluates every Nth epoch and always the last (when N > 0);
// an epoch not evaluated has no eval loss or accuracy in the summary.
func TestEvalEvery(t *testing.T) {
	for _, tc := range []struct {
		every     int
		evaluated []uint64 // from 1
	}{
		{1, []uint64{1, 2, 3}},
		{2, []uint64{2, 3}},
		{5, []uint64{3}},
		{0, nil},
	} {
		t.Run("every "+itoa(uint32(tc.every)), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Run.Epochs = 3
			cfg.Coordinator.EvalEvery = tc.every
			h := newHarness(t, cfg, nil)
			ranks := h.startAll(func(uint32) rankScript { return rankScript{msPerBatch: time.Millisecond} })
			h.mustComplete()

			var asked []uint64
			for _, e := range messagesOf[*wirepb.Evaluate](ranks[0]) {
				asked = append(asked, e.GetEpoch()+1)
			}
			if !slices.Equal(asked, tc.evaluated) {
				t.Errorf("Evaluate for epochs %v, want %v", asked, tc.evaluated)
			}
			// What summary.json says, not only the in-memory summary.
			sum, err := record.ReadSummary(h.out + "/" + record.SummaryFile)
			if err != nil {
				t.Fatal(err)
			}
			if len(sum.Epochs) != 3 {
				t.Fatalf("%d epochs in summary.json, want 3", len(sum.Epochs))
			}
			for _, e := range sum.Epochs {
				want := slices.Contains(tc.evaluated, e.Epoch)
				if (e.Accuracy != nil) != want || (e.EvalLoss != nil) != want {
					t.Errorf("epoch %d: accuracy %v, eval loss %v; evaluated: %v", e.Epoch, e.Accuracy, e.EvalLoss, want)
				}
			}
		})
	}
}

// The epoch callback's time is not batch time: a fastest rank that holds
// the role and spends 300 ms in its callback each epoch keeps its measured
// batch time (status page, cadence's checkpointed timing) and so keeps the
// role.
func TestCallbackTimeIsNotBatchTime(t *testing.T) {
	cfg := testConfig(t)
	cfg.Run.Epochs = 3
	cfg.Coordinator.Policy = config.PolicyCadence
	cfg.Coordinator.EvalRank = config.EvalRankFastest
	cfg.Coordinator.CheckpointEvery = 1
	h := newHarness(t, cfg, nil)
	fast := 4 * time.Millisecond
	h.startAll(func(r uint32) rankScript {
		s := rankScript{msPerBatch: 10 * time.Millisecond, epochFn: 300 * time.Millisecond}
		if r == 2 {
			s.msPerBatch = fast
		}
		return s
	})
	sum := h.mustComplete()

	if !h.logHas("epoch callback ran", "rank=2", "epoch=2") {
		t.Fatal("rank 2 never reported its epoch callback: the test proves nothing")
	}
	want := []record.RoleElection{{Epoch: 1, Rank: 0, Why: record.RoleFormed}, {Epoch: 1, Rank: 2, Why: record.RoleFaster}}
	if !reflect.DeepEqual(sum.Roles, want) {
		t.Errorf("roles %+v, want %+v: the callback made the holder look slow", sum.Roles, want)
	}
	if got := h.coord.Status().Ranks[2].BatchMS; got != 4 {
		t.Errorf("rank 2's batch time %v ms, want its 4 ms batches alone", got)
	}
	meta, err := checkpoint.ReadMeta(sum.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Cadence == nil || meta.Cadence.MSPerBatch[2] != 4 {
		t.Errorf("cadence timing %+v, want rank 2 at 4 ms a batch", meta.Cadence)
	}
}
