package main

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// tally: missing samples, and each sample trained twice either explained
// by the work a fault took or counted as unexplained.
func TestTally(t *testing.T) {
	const epochs, samples = 2, 3
	tr := func(rank uint32, epoch, sample uint64, off int64) training {
		return training{rank: rank, epoch: epoch, sample: sample, off: off}
	}
	// Every sample of both epochs once, by rank 0 and rank 1.
	clean := []training{tr(0, 0, 0, 0), tr(1, 0, 1, 10), tr(0, 0, 2, 20), tr(0, 1, 0, 30), tr(1, 1, 1, 40), tr(1, 1, 2, 50)}
	death := lost{cause: "rank_death", epoch: 0, rank: 1, gone: true, samples: map[uint64]bool{1: true}, from: 0, to: 1 << 40}
	for _, c := range []struct {
		name  string
		ts    []training
		losts []lost
		want  account
	}{
		{"clean", clean, nil, account{Allowed: map[string]uint64{}}},
		{"a sample never trained", clean[1:], nil, account{Missing: 1, Allowed: map[string]uint64{}}},
		{"a dead rank's sample trained again", append(clean, tr(0, 0, 1, 60)), []lost{death},
			account{Twice: 1, Allowed: map[string]uint64{"rank_death": 1}}},
		{"a dead rank's sample never trained again", clean, []lost{death},
			account{Missing: 1, Allowed: map[string]uint64{}}},
		{"a killed trainer's sample may stay", clean, []lost{{cause: "trainer_killed", epoch: 0, rank: 1, to: 1 << 40}},
			account{Allowed: map[string]uint64{}}},
		{"trained again with no fault", append(clean, tr(0, 0, 1, 60)), nil,
			account{Twice: 1, Unexplained: 1, Allowed: map[string]uint64{}}},
		{"another rank's training is not the dead rank's", append(clean, tr(1, 0, 0, 60)), []lost{death},
			account{Missing: 1, Twice: 1, Unexplained: 1, Allowed: map[string]uint64{}}},
		{"a sample outside the work taken back", append(clean, tr(0, 0, 2, 60)), []lost{{cause: "rank_death", epoch: 0, rank: 0, samples: map[uint64]bool{1: true}, to: 1 << 40}},
			account{Twice: 1, Unexplained: 1, Allowed: map[string]uint64{}}},
		{"a restart retrains the killed run's later epochs, once each, sample 2 not", append(clean, tr(2, 1, 0, 60), tr(2, 1, 1, 70), tr(3, 1, 1, 80)),
			[]lost{{cause: "coordinator_restart", epoch: 1, anyRank: true, gone: true, from: 0, to: 55}},
			account{Missing: 1, Twice: 3, Unexplained: 1, Allowed: map[string]uint64{"coordinator_restart": 2}}},
		{"only trainings written before the kill", append(clean, tr(0, 1, 2, 60)),
			[]lost{{cause: "trainer_killed", epoch: 1, rank: 1, from: 0, to: 45}},
			account{Twice: 1, Unexplained: 1, Allowed: map[string]uint64{}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := tally(c.ts, epochs, samples, c.losts)
			if got.Missing != c.want.Missing || got.Twice != c.want.Twice || got.Unexplained != c.want.Unexplained || !maps.Equal(got.Allowed, c.want.Allowed) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// readLedger keeps each line's offset and counts the lines it cannot
// read (a torn write) without guessing at them.
func TestReadLedger(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if err := os.WriteFile(path, []byte("0 0 5\n1 0 7\n2 0\nx y z\n3 1 9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ts, bad, err := readLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []training{{0, 0, 5, 0}, {1, 0, 7, 6}, {3, 1, 9, 22}}
	if bad != 2 || len(ts) != len(want) {
		t.Fatalf("%d trainings %+v, %d bad; want %+v, 2 bad", len(ts), ts, bad, want)
	}
	for i := range want {
		if ts[i] != want[i] {
			t.Fatalf("training %d: %+v, want %+v", i, ts[i], want[i])
		}
	}
}
