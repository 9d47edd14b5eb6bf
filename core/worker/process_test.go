package worker_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/testutil/arenacheck"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker"
	"github.com/cohortdl/cohort/shared/plugintest"
)

// Tests here run the mock plugins as real go-plugin processes.

func TestMain(m *testing.M) {
	code := arenacheck.Run(m)
	plugintest.RemoveBuilds()
	os.Exit(code)
}

// pluginDir returns a directory holding the mock plugin binaries.
func pluginDir(t *testing.T) string {
	t.Helper()
	trainerBin, averagerBin := plugintest.BuildPlugins(t)
	dir := t.TempDir()
	for _, bin := range []string{trainerBin, averagerBin} {
		if err := os.Symlink(bin, filepath.Join(dir, filepath.Base(bin))); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// expectGone fails unless every pid has exited (and been reaped).
func expectGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("plugin process %d outlived Run (kill 0: %v)", pid, err)
		}
	}
}

func pidsOf(t *testing.T, hp *worker.HostPlugins) (all []int, averager int) {
	t.Helper()
	for _, p := range hp.Processes() {
		pid := p.Pid()
		if pid == 0 {
			t.Fatalf("%s plugin %s has no pid", p.Kind, p.Name)
		}
		all = append(all, pid)
		if p.Kind == pluginhost.Averager {
			averager = pid
		}
	}
	if len(all) != 2 || averager == 0 {
		t.Fatalf("want a trainer and an averager process, have %d processes", len(all))
	}
	return all, averager
}

// pidOf is the pid of hp's latest plugin process of kind.
func pidOf(t *testing.T, hp *worker.HostPlugins, kind pluginhost.Kind) int {
	t.Helper()
	procs := hp.Processes()
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i].Kind == kind {
			return procs[i].Pid()
		}
	}
	t.Fatalf("no %s plugin process", kind)
	return 0
}

// TestAveragerKilledMidRound: SIGKILL of the averager process while its
// round waits for a peer. With no restart budget it is an averaging
// failure, not an abort: the worker ends with an error within a few
// seconds, sends no Exiting, and leaves no plugin process behind. With a
// budget the worker replaces the averager: PluginRestarted, then the round
// acked as aborted; the new averager applies the next session and the rank
// trains and exits cleanly.
func TestAveragerKilledMidRound(t *testing.T) {
	for _, budget := range []int{0, 1} {
		t.Run(fmt.Sprintf("budget %d", budget), func(t *testing.T) {
			dir := pluginDir(t)
			c := newCoordinator(t)
			o := c.options(0, 2, trainerSettings())
			o.PluginRestarts = budget
			hp := worker.NewHostPlugins(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Logger: testLogger()})
			o.Plugins = hp
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "kill", Seed: 1})
			expect[*wirepb.Ready](l)
			pids, averager := pidsOf(t, hp)

			l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 1, 256)})
			expectPlan(l, 2)
			l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
			expect[*wirepb.SnapshotReady](l)
			// Rank 1 never comes: the round is blocked.
			if m := l.next(300 * time.Millisecond); m != nil {
				t.Fatalf("the round ended without its peer: %s", describe(m))
			}
			if err := syscall.Kill(averager, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if budget == 0 {
				err := run.wait(15 * time.Second)
				if d := time.Since(killed); d > 4*time.Second {
					t.Errorf("worker took %v to end after its averager died", d)
				}
				if err == nil || !strings.Contains(err.Error(), "Averager.Average") || !strings.Contains(err.Error(), "plugin restart budget spent") {
					t.Fatalf("Run = %v, want the averaging round's error and the spent budget", err)
				}
				if frames := l.drain(); hasExiting(frames) {
					t.Fatalf("Exiting sent after an error exit")
				}
				expectGone(t, pids)
				expectNoWorkerGoroutines(t)
				return
			}
			pr := expect[*wirepb.PluginRestarted](l)
			if pr.GetKind() != "averager" || pr.GetRestarts() != 1 || pr.GetPlanLost() || pr.GetReason() == "" {
				t.Fatalf("PluginRestarted = %v", pr)
			}
			if ack := expect[*wirepb.SyncAck](l); !ack.GetAborted() || ack.GetRound() != 1 {
				t.Fatalf("SyncAck = %v, want round 1 aborted", ack)
			}
			if d := time.Since(killed); d > 4*time.Second {
				t.Errorf("the averager took %v to replace", d)
			}
			if pid := pidOf(t, hp, pluginhost.Averager); pid == averager || pid == 0 {
				t.Fatalf("averager pid %d after the restart, was %d", pid, averager)
			}
			// The coordinator re-forms the group (here: rank 0 alone, rank
			// 1 never came) and runs the round again.
			c.relay.dead(1)
			l.send(&wirepb.NewSession{Generation: 1, SessionId: []byte("after-restart"), NewRank: 0, NewWorldSize: 1, Members: []uint32{0}})
			l.send(&wirepb.Sync{Round: 2, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
			expect[*wirepb.SnapshotReady](l)
			if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() || ack.GetRound() != 2 {
				t.Fatalf("SyncAck = %v, want round 2 done by the new averager", ack)
			}
			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
			expectGone(t, append(pids, pidOf(t, hp, pluginhost.Averager), pidOf(t, hp, pluginhost.Trainer)))
			expectNoWorkerGoroutines(t)
		})
	}
}

// TestTrainerKilledMidPlan: SIGKILL of the trainer process in the middle of
// a plan. The worker reports what it trained (Batch frames), then
// PluginRestarted naming the lost plan and no Metrics for it; the new
// trainer holds the arena's parameters (the last Publish) and trains the
// range the coordinator hands back.
func TestTrainerKilledMidPlan(t *testing.T) {
	dir := pluginDir(t)
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "20ms"
	o := c.options(0, 1, ts)
	o.PluginRestarts = 1
	hp := worker.NewHostPlugins(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Logger: testLogger()})
	o.Plugins = hp
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "kill-trainer", Seed: 1})
	expect[*wirepb.Ready](l)
	pids, _ := pidsOf(t, hp)
	trainer := pidOf(t, hp, pluginhost.Trainer)

	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 256, 1, 256)})
	var reported uint64
	for range 3 {
		reported += uint64(expect[*wirepb.Batch](l).GetSamples())
	}
	if err := syscall.Kill(trainer, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var pr *wirepb.PluginRestarted
	for pr == nil {
		switch m := l.next(frameWait).(type) {
		case *wirepb.Batch:
			reported += uint64(m.GetSamples())
		case *wirepb.PluginRestarted:
			pr = m
		default:
			t.Fatalf("got %s, want Batch frames, then PluginRestarted", describe(m))
		}
	}
	if pr.GetKind() != "trainer" || !pr.GetPlanLost() || pr.GetPartitionOffset() != 0 || pr.GetPartitionSize() != 256 || pr.GetRestarts() != 1 {
		t.Fatalf("PluginRestarted = %v, want the lost plan [0, +256)", pr)
	}
	if reported >= 256 {
		t.Fatalf("the plan finished (%d samples) before the kill", reported)
	}
	if pid := pidOf(t, hp, pluginhost.Trainer); pid == trainer || pid == 0 {
		t.Fatalf("trainer pid %d after the restart, was %d", pid, trainer)
	}
	rest := 256 - reported
	l.send(&wirepb.ExtendPartition{Epoch: 0, PartitionOffset: reported, PartitionSize: rest})
	if m := expectPlan(l, int(rest/16)); m.GetSamples() != rest || m.GetPartitionOffset() != reported {
		t.Fatalf("Metrics = %v, want the %d samples handed back", m, rest)
	}
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
	expectGone(t, append(pids, pidOf(t, hp, pluginhost.Trainer)))
	expectNoWorkerGoroutines(t)
}

// TestConfigChoosesAverager: the averager block's label is the only thing
// that picks the backend. The same file with "mock" runs the mock plugin
// processes through a clean shutdown; with "fabric" the worker finds and
// launches cohort-averaging-fabric from the same plugin directory (here a fake
// that records its environment and exits), without the run secret in its
// environment.
func TestConfigChoosesAverager(t *testing.T) {
	dir := pluginDir(t)
	envFile := filepath.Join(t.TempDir(), "fabric-env")
	fake := fmt.Sprintf("#!/bin/sh\nenv > %q\nexit 1\n", envFile)
	if err := os.WriteFile(filepath.Join(dir, "cohort-averaging-fabric"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COHORT_SECRET", "must-not-reach-plugins")

	file := func(averager string) []byte {
		return fmt.Appendf(nil, `
worker {
  plugin_dir       = %q
  liveness_timeout = "10s"
  shutdown_grace   = "2s"
}
trainer "mock" {
  samples      = 256
  eval_samples = 64
  features     = 8
  batch_size   = 16
  lr           = 0.1
}
averager %q {
  gamma = 1
}
`, dir, averager)
	}
	cases := []struct {
		averager string
		wantBin  string
		clean    bool
	}{
		{"mock", "cohort-averaging-mock", true},
		{"fabric", "cohort-averaging-fabric", false},
	}
	for _, tc := range cases {
		t.Run(tc.averager, func(t *testing.T) {
			cfg, err := config.Parse(file(tc.averager), "cohort.hcl")
			if err != nil {
				t.Fatal(err)
			}
			o := worker.FromConfig(cfg)
			loc, err := pluginhost.Find(o.PluginDirs, pluginhost.Averager, o.Averager.Name)
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(dir, tc.wantBin); loc.Path != want {
				t.Fatalf("config picks %s, want %s", loc.Path, want)
			}

			c := newCoordinator(t)
			o.Coordinator, o.Rank, o.World, o.Secret = c.addr(), 0, 1, testSecret
			o.ArenaDir, o.Logger = t.TempDir(), testLogger()
			o.Withhold = []string{"COHORT_SECRET"}
			run := start(t, o)
			l := c.accept(&wirepb.Admit{RunId: "config", Seed: 1})
			if !tc.clean {
				err := run.wait(frameWait)
				if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, tc.wantBin)) {
					t.Fatalf("Run = %v, want a failure to start %s", err, tc.wantBin)
				}
				env, err := os.ReadFile(envFile)
				if err != nil {
					t.Fatalf("the cpu plugin was not launched: %v", err)
				}
				if strings.Contains(string(env), "COHORT_SECRET=") {
					t.Fatalf("the plugin saw COHORT_SECRET")
				}
				return
			}
			expect[*wirepb.Ready](l)
			l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 32, 1, 256)})
			expectPlan(l, 2)
			l.send(&wirepb.Sync{Round: 0, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
			expect[*wirepb.SnapshotReady](l)
			if ack := expect[*wirepb.SyncAck](l); ack.GetAborted() || ack.GetWeight() != 2 {
				t.Fatalf("SyncAck = %v", ack)
			}
			l.send(&wirepb.Shutdown{})
			expect[*wirepb.Exiting](l)
			if err := run.wait(frameWait); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestResourceSampleCoversPlugins: a rank's ResourceSample reads its own
// core and each plugin process, by pid, with CPU from the second sample on.
func TestResourceSampleCoversPlugins(t *testing.T) {
	dir := pluginDir(t)
	c := newCoordinator(t)
	o := c.options(0, 1, trainerSettings())
	o.ResourceInterval = 50 * time.Millisecond
	hp := worker.NewHostPlugins(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Logger: testLogger()})
	o.Plugins = hp
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "resources", Seed: 1})
	expect[*wirepb.Ready](l)
	pids, averager := pidsOf(t, hp)
	want := map[int]string{os.Getpid(): "worker"}
	for _, pid := range pids {
		want[pid] = "trainer"
	}
	want[averager] = "averager"

	deadline := time.After(5 * time.Second)
	for done := false; !done; {
		select {
		case m := <-l.frames:
			rs, ok := m.(*wirepb.ResourceSample)
			if !ok || len(rs.GetProcesses()) != 3 || rs.GetProcesses()[2].CpuPercent == nil {
				continue
			}
			for _, p := range rs.GetProcesses() {
				if role := want[int(p.GetPid())]; role != p.GetRole() {
					t.Errorf("process %d reads as %q, want %q", p.GetPid(), p.GetRole(), role)
				}
				if p.GetRssBytes() == 0 {
					t.Errorf("%s process %d: no RSS", p.GetRole(), p.GetPid())
				}
			}
			done = true
		case <-deadline:
			t.Fatal("no ResourceSample covering the worker and both plugins within 5 s")
		}
	}
	l.send(&wirepb.Shutdown{})
	if err := run.wait(10 * time.Second); err != nil {
		t.Fatalf("Run = %v", err)
	}
	expectGone(t, pids)
}

// TestTrainerLostTakingARoundBesideTraining: the trainer process dies in
// the Adopt of a round that ran beside its Train. The worker must answer
// the round (aborted, so the coordinator runs it again) as well as report
// the lost plan, then train on with a fresh trainer; before, it reported
// the plan alone and the coordinator waited for the round's SyncAck for
// ever.
func TestTrainerLostTakingARoundBesideTraining(t *testing.T) {
	dir := pluginDir(t)
	c := newCoordinator(t)
	ts := trainerSettings()
	ts.SleepPerBatch = "20ms"
	ts.ExitOnAdopt = 1
	o := c.options(0, 1, ts)
	o.PluginRestarts = 1
	hp := worker.NewHostPlugins(pluginhost.Options{Dirs: []string{dir}, Grace: 2 * time.Second, Logger: testLogger()})
	o.Plugins = hp
	run := start(t, o)
	l := c.accept(&wirepb.Admit{RunId: "lost-adopting", Seed: 1, OverlapRounds: true})
	expect[*wirepb.Ready](l)
	trainer := pidOf(t, hp, pluginhost.Trainer)

	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 256, 1, 256)}) // 16 batches
	expect[*wirepb.Batch](l)
	l.send(&wirepb.Sync{Round: 1, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE, Overlap: true})
	ack, pr := expectLostRound(l)
	if !ack.GetAborted() || ack.GetRound() != 1 {
		t.Fatalf("SyncAck = %v, want round 1 aborted", ack)
	}
	if pr.GetKind() != "trainer" || !pr.GetPlanLost() {
		t.Fatalf("PluginRestarted = %v, want the trainer with its plan lost", pr)
	}
	if pid := pidOf(t, hp, pluginhost.Trainer); pid == trainer || pid == 0 {
		t.Fatalf("trainer pid %d after the restart, was %d", pid, trainer)
	}
	// The coordinator runs the round again, and the rank trains on.
	l.send(&wirepb.Sync{Round: 2, Mode: wirepb.SyncMode_SYNC_MODE_AVERAGE})
	expectRoundDone(l, 2)
	l.send(&wirepb.StartEpoch{Plan: plan(0, 0, 64, 1, 256)})
	expectPlan(l, 4)
	l.send(&wirepb.Shutdown{})
	expect[*wirepb.Exiting](l)
	if err := run.wait(frameWait); err != nil {
		t.Fatal(err)
	}
	expectNoWorkerGoroutines(t)
}
