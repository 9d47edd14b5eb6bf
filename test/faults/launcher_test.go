package faults

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// `cohort run` SIGKILLed while it writes a checkpoint, at each point of
// the write (checkpoint.go: a temp directory, each rank's state in it,
// meta.json, the rename), and at a random moment: every worker and plugin
// dies with it (the workers by Pdeathsig, their plugins when their host
// goes) and no arena is left; the last complete checkpoint
// (checkpoint.LastCheckpoint) has a valid meta.json and every saved
// rank's state loads; `--resume` carries on from it, removing the
// half-written one. The last resume runs to the end, and every epoch is
// trained and counted in full.
func TestLauncherKilled(t *testing.T) {
	r := newRun(t, 2, 8, 512, "  checkpoint_every = 1\n  sync_every = 2", "",
		map[string]any{"sleep_per_batch": "4ms"}, nil)
	ckpts := filepath.Join(r.out, checkpoint.CheckpointsDir)
	tmp := func() string {
		m, _ := filepath.Glob(filepath.Join(ckpts, ".tmp-*"))
		if len(m) == 0 {
			return ""
		}
		return m[len(m)-1]
	}
	saved := func(dir string) bool {
		ents, _ := os.ReadDir(filepath.Join(dir, "rank-0"))
		return len(ents) > 0
	}
	exists := func(path string) bool { _, err := os.Stat(path); return err == nil }
	points := []struct {
		name string
		at   func() bool
	}{
		{"temp directory made", func() bool { return tmp() != "" }},
		{"a rank's state written", func() bool { d := tmp(); return d != "" && saved(d) }},
		{"meta.json written", func() bool { d := tmp(); return d != "" && exists(filepath.Join(d, checkpoint.MetaFile)) }},
		{"random moment", nil},
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for i, pt := range points {
		p := r.launch(i > 0)
		id := runID(t, p)
		p.waitLine("cohort formed", 30*time.Second)
		// The first kill waits for a complete checkpoint to fall back on.
		for deadline := time.Now().Add(20 * time.Second); i == 0 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if _, err := checkpoint.LastCheckpoint(ckpts); err == nil {
				break
			}
		}
		hit := pt.at == nil
		if pt.at == nil {
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		} else {
			for deadline := time.Now().Add(20 * time.Second); !hit && time.Now().Before(deadline); {
				hit = pt.at()
			}
		}
		if err := p.cmd.Process.Kill(); err != nil || p.exit(10*time.Second) == 0 {
			t.Fatalf("%s: the kill came too late: the run had ended (%v)", pt.name, err)
		}
		checkNothingLeft(t, id, 10*time.Second)
		last := checkLoads(t, r)
		t.Logf("killed at %s (landed: %v); last complete checkpoint %s, half-written: %q", pt.name, hit, filepath.Base(last), filepath.Base(tmp()))
	}
	p := r.launch(true)
	id := runID(t, p)
	if code := p.exit(60 * time.Second); code != 0 {
		t.Fatalf("final resume: exit %d", code)
	}
	checkNothingLeft(t, id, 10*time.Second)
	if sum := r.checkCompleted(); sum.Checkpoint == "" {
		t.Error("the completed run names no checkpoint")
	}
	if d := tmp(); d != "" {
		t.Errorf("half-written checkpoint left after the resumed run: %s", d)
	}
}

// checkLoads checks the run's last complete checkpoint: its meta.json is
// valid and every rank it lists as saved loads into the mock trainer.
// It returns the checkpoint's path.
func checkLoads(t *testing.T, r *run) string {
	t.Helper()
	last, err := checkpoint.LastCheckpoint(filepath.Join(r.out, checkpoint.CheckpointsDir))
	if err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.ReadMeta(last)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.SavedRanks) == 0 {
		t.Fatalf("checkpoint %s saved no rank", last)
	}
	for _, rank := range m.SavedRanks {
		dir := filepath.Join(last, "rank-"+strconv.FormatUint(uint64(rank), 10))
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("checkpoint %s: %v", last, err)
		}
		loadMock(t, dir, r.trainer)
	}
	return last
}

// loadMock loads one rank's saved state (the trainer's folder of its
// checkpoint directory dir) into a fresh mock trainer, as a resumed rank
// would.
func loadMock(t *testing.T, dir string, settings map[string]any) {
	t.Helper()
	raw, err := json.Marshal(settings)
	if err != nil {
		t.Fatal(err)
	}
	tr := plugintest.NewTrainer(nil)
	ctx := context.Background()
	if _, err := tr.Configure(ctx, plugin.TrainerConfig{Rank: 0, WorldSize: 1, Seed: 1, Settings: raw}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.LoadCheckpoint(ctx, filepath.Join(dir, "trainer"), plugin.LoadResume); err != nil {
		t.Fatalf("load %s: %v", dir, err)
	}
}

// `cohort run` of one rank, interrupted (SIGINT) mid-epoch and resumed:
// a lone rank trains solo plans, whose trainer process merges its batch
// reports for up to 100 ms, and a report merged but not sent when a stop
// cancels Train would leave batches in the saved model that the save
// counts as still to train. The interrupt lets the plans in flight
// finish, every report arrives, and the resumed run trains every sample
// of every epoch exactly once.
func TestLoneRankInterruptResumesExactlyOnce(t *testing.T) {
	r := newRun(t, 1, 2, 4096, "  checkpoint_every = 1", "", map[string]any{"sleep_per_batch": "2ms"}, nil)
	p := r.launch(false)
	p.waitLine("cohort formed", 30*time.Second)
	time.Sleep(150 * time.Millisecond) // into epoch 1: 256 batches of 2 ms
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(20 * time.Second); code == 0 {
		t.Fatal("the run ended before the interrupt reached it")
	}
	p = r.launch(true)
	if code := p.exit(60 * time.Second); code != 0 {
		t.Fatalf("the resumed run exited %d", code)
	}
	r.checkCompleted()
	led := readLedger(t, r.ledger)
	for e := range uint64(r.epochs) {
		for i, ranks := range led[e] {
			if len(ranks) != 1 {
				t.Fatalf("epoch %d: sample %d trained %d times", e+1, i, len(ranks))
			}
		}
	}
}
