package plugintest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// sameReports compares reports but for their timings.
func sameReports(t *testing.T, got, want []plugin.BatchReport) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d reports, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		// Times differ run to run.
		g.BatchMS, g.DataMS, g.RoundWaitMS, w.BatchMS, w.DataMS, w.RoundWaitMS = 0, 0, 0, 0, 0, 0
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("report %d = %+v, want %+v", i, g, w)
		}
	}
}

func collect(reps *[]plugin.BatchReport) func(plugin.BatchReport) error {
	return func(r plugin.BatchReport) error {
		*reps = append(*reps, r)
		return nil
	}
}

// TestPluginTrainerRPCs drives a trainer plugin process and an in-process
// twin through every Trainer RPC: the answers must agree exactly.
func TestPluginTrainerRPCs(t *testing.T) {
	trBin, _ := BuildPlugins(t)
	ctx := context.Background()
	remote, _ := StartTrainer(t, trBin)
	local := NewTrainer(nil)
	defer local.Shutdown(ctx)
	both := []plugin.Trainer{remote, local}

	rd, err := remote.Describe(ctx)
	if ld, _ := local.Describe(ctx); err != nil || !reflect.DeepEqual(rd, ld) {
		t.Fatalf("Describe = %+v, %v; want %+v", rd, err, ld)
	}

	cfg := plugin.TrainerConfig{Rank: 1, WorldSize: 2, LocalRanks: 2, Seed: 13, Settings: small().JSON()}
	rs, err := remote.Configure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ls, _ := local.Configure(ctx, cfg); !reflect.DeepEqual(rs, ls) {
		t.Fatalf("Configure = %+v, want %+v", rs, ls)
	}
	if _, err := remote.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, Settings: []byte(`{"nope": 1}`)}); err == nil || !strings.Contains(err.Error(), "unknown key") {
		t.Errorf("Configure with a bad key: %v", err)
	}
	if _, err := remote.Configure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	arenas := []*arena.Owned{newArena(t, rs.Layout), newArena(t, rs.Layout)}
	for i, tr := range both {
		if zero, err := tr.Attach(ctx, arenas[i].Descriptor()); err != nil || zero {
			t.Fatalf("Attach = %v, %v", zero, err)
		}
	}
	sameArenas := func(what string) {
		t.Helper()
		if !bytes.Equal(arenas[0].Bytes(), arenas[1].Bytes()) {
			t.Fatalf("%s: the plugin's arena differs from the in-process twin's", what)
		}
	}

	plan := plugin.Plan{Epoch: 2, Seed: 13, PickSpace: rs.Samples, PartitionOffset: 10, PartitionSize: 200, GlobalStep: 40}
	var reps [2][]plugin.BatchReport
	for i, tr := range both {
		if err := tr.Train(ctx, plan, collect(&reps[i])); err != nil {
			t.Fatal(err)
		}
	}
	sameReports(t, reps[0], reps[1])
	if reps[0][9].ParamNorm == nil {
		t.Fatal("the 10th step's report lost its param norm on the way")
	}

	var pubs [2]plugin.PublishResult
	for i, tr := range both {
		if pubs[i], err = tr.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if pubs[0] != pubs[1] || pubs[0].Steps != uint64(len(reps[0])) {
		t.Fatalf("Publish = %+v, want %+v", pubs[0], pubs[1])
	}
	sameArenas("after Publish")

	for _, a := range arenas {
		w := floats(t, a.Mapping, 0)
		for k := range w {
			w[k] = float32(k) / 8
		}
	}
	var norms [2]float64
	for i, tr := range both {
		if norms[i], err = tr.Adopt(ctx, 0.5); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if norms[0] != norms[1] {
		t.Fatalf("Adopt norm %v, want %v", norms[0], norms[1])
	}
	sameArenas("after Adopt and Publish")
	if _, err := remote.Adopt(ctx, 2); err == nil || !strings.Contains(err.Error(), "outside [0, 1]") {
		t.Errorf("Adopt(2) = %v, want the plugin's refusal", err)
	}

	var evals [2]plugin.EvalResult
	for i, tr := range both {
		if evals[i], err = tr.Evaluate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(evals[0], evals[1]) || evals[0].Accuracy == nil {
		t.Fatalf("Evaluate = %+v, want %+v", evals[0], evals[1])
	}

	// The plugin's checkpoint restores in the twin and in the plugin.
	dir := t.TempDir()
	files, err := remote.SaveCheckpoint(ctx, dir)
	if err != nil || !slices.Equal(files, []string{filepath.Join(dir, CheckpointFile)}) {
		t.Fatalf("SaveCheckpoint = %v, %v", files, err)
	}
	if err := remote.Train(ctx, plugin.Plan{Epoch: 3, Seed: 13, PickSpace: rs.Samples, PartitionSize: 64}, nil); err != nil {
		t.Fatal(err)
	}
	for _, tr := range both {
		res, err := tr.LoadCheckpoint(ctx, dir, plugin.LoadResume)
		if err != nil || res.StepCount != pubs[0].StepCount {
			t.Fatalf("LoadCheckpoint = %+v, %v; want step count %d", res, err, pubs[0].StepCount)
		}
		if _, err := tr.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sameArenas("after LoadCheckpoint")

	// A report error stops the plugin's Train and comes back as it was.
	stop := errors.New("enough")
	n := 0
	err = remote.Train(ctx, plugin.Plan{Seed: 1, PickSpace: rs.Samples, PartitionSize: rs.Samples}, func(plugin.BatchReport) error {
		n++
		if n == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 3 {
		t.Fatalf("Train with a failing report = %v after %d reports", err, n)
	}
	// The plugin's Train ends on the cancelled stream; a new one can run.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err = remote.Train(ctx, plugin.Plan{Seed: 1, PickSpace: rs.Samples, PartitionSize: 16}, nil)
		if err == nil || !strings.Contains(err.Error(), "already running") || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Train after a cancelled Train: %v", err)
	}
	ctxc, cancel := context.WithCancel(ctx)
	cancel()
	if err := remote.Train(ctxc, plan, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Train with a cancelled context = %v", err)
	}

	if err := remote.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Publish(ctx); err == nil {
		t.Error("Publish after Shutdown succeeded")
	}
}

// TestPluginAveragerRPCs runs rank 0 as an averager plugin process and
// rank 1 in-process, on one relay group (rank 0's relay served back to its
// process over the go-plugin broker), through every Averager RPC.
func TestPluginAveragerRPCs(t *testing.T) {
	_, avBin := BuildPlugins(t)
	ctx := context.Background()
	remote, _ := StartAverager(t, avBin)
	local := NewAverager(nil)
	defer local.Shutdown(ctx)
	both := []plugin.Averager{remote, local}

	if d, err := remote.Describe(ctx); err != nil || d.Name != AveragerName || d.Version == "" {
		t.Fatalf("Describe = %+v, %v", d, err)
	}
	layout := avgLayout(t)
	g := NewRelayGroup(2)
	arenas := make([]*arena.Owned, 2)
	for i, a := range both {
		arenas[i] = newArena(t, layout)
		fill(t, arenas[i].Mapping, i)
		s := DefaultAveragerSettings()
		s.Gamma = 0.5
		if _, err := a.Configure(ctx, plugin.AveragerConfig{Rank: uint32(i), WorldSize: 2, Arena: arenas[i].Descriptor(),
			Relay: g.Relay(uint32(i)), DataKey: []byte("k"), Settings: s.JSON(), RunID: "rpc"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := remote.Configure(ctx, plugin.AveragerConfig{Rank: 0, WorldSize: 2, Arena: arenas[0].Descriptor(), Settings: []byte(`{"gamma": -2}`)}); err == nil {
		t.Error("Configure with a bad config succeeded")
	}
	round := func(r uint64, steps ...uint64) []plugin.RoundResult {
		t.Helper()
		res := make([]plugin.RoundResult, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, a := range both {
			wg.Go(func() { res[i], errs[i] = a.Average(ctx, plugin.Round{Round: r, Steps: steps[i]}) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		if !bytes.Equal(floatBytes(t, arenas[0]), floatBytes(t, arenas[1])) {
			t.Fatalf("round %d: the ranks disagree", r)
		}
		return res
	}
	res := round(0, 4, 1)
	if res[0].Weight != 2 || res[0].TotalWeight != 3 || !res[0].Realized || res[0].BytesMoved != 2*contribSize(layout) || res[0].Divergence <= 0 {
		t.Errorf("round 0 result from the plugin = %+v", res[0])
	}

	ids := make([][]byte, 2)
	for i := range ids {
		id, err := remote.NewSessionID(ctx)
		if err != nil || len(id) != 16 {
			t.Fatalf("NewSessionID = %x, %v", id, err)
		}
		ids[i] = id
	}
	if bytes.Equal(ids[0], ids[1]) {
		t.Error("two session ids are equal")
	}

	// The in-process peer never comes to round 1: Abort ends the plugin's
	// wait, and the plugin stays aborted.
	errc := make(chan error, 1)
	go func() {
		_, err := remote.Average(ctx, plugin.Round{Round: 1, Steps: 1})
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := remote.Abort(ctx, "peer 1 is dead"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), ErrAborted.Error()) || !strings.Contains(err.Error(), "peer 1 is dead") {
			t.Errorf("aborted round = %v", err)
		}
		if !errors.Is(err, plugin.ErrRoundAborted) {
			t.Errorf("aborted round %v is not plugin.ErrRoundAborted on the host side", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Abort did not end the plugin's round within 2s")
	}
	if _, err := remote.Average(ctx, plugin.Round{Round: 1, Steps: 1}); err == nil {
		t.Error("a round after Abort succeeded")
	}
	for i, a := range both {
		if err := a.NewSession(ctx, plugin.Session{Generation: 1, ID: ids[1], NewRank: uint32(i), NewWorldSize: 2, Members: []uint32{0, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := remote.NewSession(ctx, plugin.Session{Generation: 2, NewRank: 0, NewWorldSize: 1, Members: []uint32{1}}); err == nil {
		t.Error("a session without this rank was accepted")
	}
	round(1, 0, 3)

	// The mock keeps no state between rounds: it saves nothing and loads
	// from an empty directory without complaint.
	stateDir := t.TempDir()
	if files, err := remote.SaveState(ctx, stateDir); err != nil || len(files) != 0 {
		t.Errorf("SaveState = %v, %v; want no files", files, err)
	}
	if err := remote.LoadState(ctx, stateDir); err != nil {
		t.Errorf("LoadState: %v", err)
	}

	if err := remote.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Average(ctx, plugin.Round{Round: 2}); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("Average after Shutdown = %v", err)
	}
}

// floatBytes is the f32 entries of a's layout, concatenated.
func floatBytes(t *testing.T, a *arena.Owned) []byte {
	var out []byte
	for i, e := range a.Layout().Entries {
		if e.DType.IsFloat() {
			b, err := a.Tensor(i)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b...)
		}
	}
	return out
}

// TestPluginDataPlane moves a model far over gRPC's 4 MiB default through
// arenas: two ranks, each a trainer process and an averager process.
func TestPluginDataPlane(t *testing.T) {
	trBin, avBin := BuildPlugins(t)
	const world = 2
	ctx := context.Background()
	s := DefaultTrainerSettings()
	s.Features, s.Samples, s.EvalSamples, s.BatchSize = 1<<21, 4, 2, 2
	g := NewRelayGroup(world)
	trainers := make([]plugin.Trainer, world)
	avgs := make([]plugin.Averager, world)
	arenas := make([]*arena.Owned, world)
	for r := range world {
		trainers[r], _ = StartTrainer(t, trBin)
		avgs[r], _ = StartAverager(t, avBin)
	}
	// The ranks set up and train at once, as they would.
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() { arenas[r], errs[r] = dataPlaneRank(t, r, trainers[r], avgs[r], s, g.Relay(uint32(r))) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	// The mean, in float64 in rank order: both ranks weigh 1.
	// The whole blocks, padding (zero everywhere) included.
	x0, x1 := arena.AsFloat32s(arenas[0].Bytes()), arena.AsFloat32s(arenas[1].Bytes())
	if bytes.Equal(arenas[0].Bytes(), arenas[1].Bytes()) {
		t.Fatal("ranks trained on different samples publish the same model")
	}
	want := make([]byte, len(arenas[0].Bytes()))
	mean := arena.AsFloat32s(want)
	for k := range mean {
		mean[k] = float32((float64(x0[k]) + float64(x1[k])) / 2)
	}
	values := uint64(0) // f32 values in a contribution
	for _, e := range arenas[0].Layout().Entries {
		values += e.Bytes / 4
	}

	res := make([]plugin.RoundResult, world)
	start := time.Now()
	for r, av := range avgs {
		wg.Go(func() { res[r], errs[r] = av.Average(ctx, plugin.Round{Round: 0, Steps: 1}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("averaged %d MiB per rank in %v (plugin says total %.1f ms, wait %.1f ms)", len(want)>>20, time.Since(start), res[0].TotalMS, res[0].WaitMS)
	for r, a := range arenas {
		if !bytes.Equal(a.Bytes(), want) {
			t.Fatalf("rank %d's arena does not hold the mean", r)
		}
		if res[r].BytesMoved != 2*(contribHeader+4*values) {
			t.Errorf("rank %d moved %d bytes, want %d", r, res[r].BytesMoved, 2*(contribHeader+4*values))
		}
	}

	// The trainers adopt the mean: wipe the arenas, publish, compare.
	for r, tr := range trainers {
		if _, err := tr.Adopt(ctx, 0); err != nil {
			t.Fatal(err)
		}
		clear(arenas[r].Bytes())
		if pub, err := tr.Publish(ctx); err != nil || pub.Steps != 0 {
			t.Fatalf("Publish after Adopt = %+v, %v", pub, err)
		}
		if !bytes.Equal(arenas[r].Bytes(), want) {
			t.Fatalf("trainer %d does not hold the mean after Adopt", r)
		}
	}
}

// dataPlaneRank configures rank r's trainer and averager on a new arena,
// trains the rank's half of the samples and publishes.
func dataPlaneRank(t *testing.T, r int, tr plugin.Trainer, av plugin.Averager, s TrainerSettings, relay plugin.Relay) (*arena.Owned, error) {
	ctx := context.Background()
	setup, err := tr.Configure(ctx, plugin.TrainerConfig{Rank: uint32(r), WorldSize: 2, Seed: 17, Settings: s.JSON()})
	if err != nil {
		return nil, err
	}
	if setup.Layout.Entries[0].Bytes <= 4<<20 {
		return nil, fmt.Errorf("weight is %d bytes, want more than 4 MiB", setup.Layout.Entries[0].Bytes)
	}
	a, err := arena.Create(t.TempDir(), fmt.Sprintf("plugintest-r%d", r), setup.Layout)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { a.Remove() })
	if _, err := tr.Attach(ctx, a.Descriptor()); err != nil {
		return nil, err
	}
	if _, err := av.Configure(ctx, plugin.AveragerConfig{Rank: uint32(r), WorldSize: 2, Arena: a.Descriptor(), Relay: relay}); err != nil {
		return nil, err
	}
	plan := plugin.Plan{Seed: 17, PickSpace: s.Samples, PartitionOffset: uint64(r) * 2, PartitionSize: 2}
	if err := tr.Train(ctx, plan, nil); err != nil {
		return nil, err
	}
	if pub, err := tr.Publish(ctx); err != nil || pub.Steps != 1 {
		return nil, fmt.Errorf("rank %d: Publish = %+v, %v; want 1 step", r, pub, err)
	}
	return a, nil
}

// TestPluginNoisyStdout starts the trainer with junk on stdout before the
// handshake (fmt and a raw write(2)) and again in Configure: the plugin
// must start, work, and the junk must surface in the host's log.
func TestPluginNoisyStdout(t *testing.T) {
	trBin, _ := BuildPlugins(t)
	ctx := context.Background()
	var log LogBuffer
	logger := hclog.New(&hclog.LoggerOptions{Name: "host", Level: hclog.Debug, Output: &log})
	c := StartClient(t, trBin, logger, NoiseEnv+"=1")
	tr, err := plugin.DispenseTrainer(c)
	if err != nil {
		t.Fatalf("a trainer printing to stdout did not start: %v\n%s", err, log.String())
	}
	s := small()
	s.NoiseStdout = true
	setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, Seed: 1, Settings: s.JSON()})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Train(ctx, fullEpoch(1, 0, setup.Samples), nil); err != nil {
		t.Fatal(err)
	}
	if ev, err := tr.Evaluate(ctx); err != nil || ev.Loss >= math.Ln2 {
		t.Fatalf("Evaluate = %+v, %v", ev, err)
	}
	lines := []string{
		"junk on stdout from mock trainer factory through fmt",
		"junk on stdout from mock trainer factory through write(2)",
		"junk on stdout from mock trainer Configure through fmt",
		"junk on stdout from mock trainer Configure through write(2)",
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, l := range lines {
		for !strings.Contains(log.String(), l) {
			if time.Now().After(deadline) {
				t.Fatalf("the host's log lacks %q:\n%s", l, log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestPluginParentDeath SIGKILLs a host process (this test binary, switched
// by hostEnv) and expects its averager plugin to exit on its own.
func TestPluginParentDeath(t *testing.T) {
	_, avBin := BuildPlugins(t)
	// Orphans of this process's children become its own, so the plugin
	// can be reaped here and a zombie is never mistaken for a live plugin.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Logf("no subreaper (%v); a zombie counts as gone", err)
	}
	host := exec.Command(os.Args[0], "-test.run=^$")
	// The plugin dies with its host by the parent-death signal and cannot
	// remove its socket: it goes in the test's own temporary directory.
	host.Env = append(os.Environ(), hostEnv+"="+avBin, "TMPDIR="+t.TempDir())
	var stderr LogBuffer
	host.Stderr = &stderr
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	hostDone := false
	t.Cleanup(func() {
		if !hostDone {
			host.Process.Kill()
			host.Wait()
		}
	})

	pidc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var pid int
			if _, err := fmt.Sscanf(sc.Text(), "pid %d", &pid); err == nil {
				pidc <- pid
				return
			}
		}
		close(pidc)
	}()
	var pid int
	select {
	case p, ok := <-pidc:
		if !ok || p <= 0 {
			t.Fatalf("the host exited without a plugin pid:\n%s", stderr.String())
		}
		pid = p
	case <-time.After(30 * time.Second):
		t.Fatalf("no plugin pid from the host within 30s:\n%s", stderr.String())
	}
	if gone(pid) {
		t.Fatalf("plugin %d is not running while its host lives", pid)
	}
	t.Cleanup(func() {
		if !gone(pid) {
			unix.Kill(pid, unix.SIGKILL)
			for range 100 {
				if gone(pid) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	})

	if err := host.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	host.Wait()
	hostDone = true
	killed := time.Now()
	for !gone(pid) {
		if time.Since(killed) > 5*time.Second {
			t.Fatalf("plugin %d still runs 5s after its host was SIGKILLed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("plugin %d gone %v after its host", pid, time.Since(killed).Round(time.Millisecond))
}

// gone reports whether process pid has exited, reaping it when it is this
// process's child (it is once its host died, with this process a
// subreaper); a zombie someone else must reap counts as gone.
func gone(pid int) bool {
	var ws unix.WaitStatus
	wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	switch {
	case wpid == pid:
		return true
	case err == nil:
		return false // our child, still running
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) state ...": comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z'
	}
	return false
}

// TestKillRemovesAKilledPluginsSocket: a plugin killed by a signal cannot
// unlink its socket; plugin.Kill, its host's end of the client, does.
func TestKillRemovesAKilledPluginsSocket(t *testing.T) {
	_, avBin := BuildPlugins(t)
	_, c := StartAverager(t, avBin)
	rc := c.ReattachConfig()
	if rc == nil || rc.Addr.Network() != "unix" || rc.Pid <= 0 {
		t.Fatalf("reattach config %+v: want a unix socket and a pid", rc)
	}
	sock := rc.Addr.String()
	if err := unix.Kill(rc.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; !c.Exited(); i++ {
		if i == 1000 {
			t.Fatalf("plugin %d still running 10s after SIGKILL", rc.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("the killed plugin's socket %s is already gone (%v): nothing to test", sock, err)
	}
	plugin.Kill(c)
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket %s after plugin.Kill: %v, want it removed", sock, err)
	}
}
