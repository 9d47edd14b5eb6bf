// Package conformance is the test suite every cohort trainer and averager
// must pass: it checks the promises of shared/plugin's Trainer and Averager
// contracts, each promise a subtest whose failure names the promise broken
// and what was expected against what came. It owns those checks and the
// scaffolding they run on (arenas, an in-process relay, cohorts of ranks);
// the contracts themselves are shared/plugin's.
//
// A vendor calls it from their own tests, on their implementation in
// process and on their built plugin binary under go-plugin:
//
//	func TestConformance(t *testing.T) {
//		t.Run("in-process", func(t *testing.T) {
//			conformance.RunAverager(t, func(conformance.T) (plugin.Averager, error) {
//				return myavg.New(), nil
//			}, conformance.Gamma(2, []byte(`{"gamma": 2}`)))
//		})
//		t.Run("binary", func(t *testing.T) {
//			conformance.RunAverager(t, conformance.AveragerBinary("./bin/my-averager"))
//		})
//	}
//
// RunTrainer does the same for a trainer; TrainerSettings should make its
// model and data small, and BadTrainerSettings adds config blocks its
// Configure must refuse. The trainer's checks configure a trainer per rank
// where a promise concerns the ranks (its picks, on a world of
// TrainerWorld), replace a trainer mid-run on the same arena, as a rank
// does after its trainer died, and compare what trainers configured alike
// learn from the same parameters. An averager whose ranks meet at a
// reduce server (Describe.Meeting plugin.MeetReduceServer) needs
// MeetingPoint, through which the test starts one server per cohort of the
// suite. CheckAverager and CheckTrainer take a T instead of a *testing.T,
// to run the suite under a recorder.
package conformance
