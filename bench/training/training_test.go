package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/internal/testutil/proctab"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

func TestTimeToTarget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		seconds  []float64
		accuracy []float64
		target   float64
		want     float64
		ok       bool
	}{
		{"first epoch", []float64{1, 2, 3}, []float64{0.86, 0.87, 0.88}, 0.85, 1, true},
		{"last epoch", []float64{0.9, 0.95, 0.85}, []float64{0.81, 0.84, 0.8539}, 0.85, 2.7, true},
		{"exactly the target counts", []float64{1, 1}, []float64{0.8, 0.85}, 0.85, 2, true},
		{"first crossing, not the last", []float64{1, 1, 1}, []float64{0.86, 0.84, 0.87}, 0.85, 1, true},
		{"never reached", []float64{1, 1, 1}, []float64{0.8, 0.84, 0.849}, 0.85, 0, false},
		{"no epochs", nil, nil, 0.85, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := timeToTarget(tc.seconds, tc.accuracy, tc.target)
			if ok != tc.ok || round4(got) != tc.want {
				t.Fatalf("timeToTarget = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestCrossingTime(t *testing.T) {
	for _, tc := range []struct {
		name     string
		elapsed  []float64
		accuracy []float64
		target   float64
		want     float64
		ok       bool
	}{
		{"between two evaluations", []float64{10, 20, 30}, []float64{0.8, 0.84, 0.88}, 0.85, 22.5, true},
		{"in the first epoch, from chance at 0 s", []float64{10, 20}, []float64{0.9, 0.95}, 0.5, 5, true},
		{"exactly at an evaluation", []float64{10, 20}, []float64{0.8, 0.85}, 0.85, 20, true},
		{"first crossing, not the last", []float64{1, 2, 3}, []float64{0.86, 0.84, 0.87}, 0.85, 0.9868, true},
		{"after a dip", []float64{1, 2, 3}, []float64{0.84, 0.8, 0.9}, 0.85, 2.5, true},
		{"never reached", []float64{1, 2, 3}, []float64{0.8, 0.84, 0.849}, 0.85, 0, false},
		{"no epochs", nil, nil, 0.85, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := crossingTime(tc.elapsed, tc.accuracy, tc.target)
			if ok != tc.ok || round4(got) != tc.want {
				t.Fatalf("crossingTime = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestEpochFigures(t *testing.T) {
	acc := func(v float64) *float64 { return &v }
	e, err := epochFigures([]record.EpochSummary{
		{Epoch: 0, Seconds: 0.95221, Accuracy: acc(0.8151)},
		{Epoch: 1, Seconds: 0.979, Accuracy: acc(0.8463)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(e.seconds, []float64{0.9522, 0.979}) || !reflect.DeepEqual(e.accuracy, []float64{0.8151, 0.8463}) {
		t.Fatalf("got %+v", e)
	}
	if _, err := epochFigures([]record.EpochSummary{{Epoch: 0, Seconds: 1}}); err == nil || !strings.Contains(err.Error(), "no accuracy") {
		t.Fatalf("an epoch without accuracy: %v", err)
	}
	if _, err := epochFigures(nil); err == nil {
		t.Fatal("no epochs: no error")
	}
}

func TestParsePeer(t *testing.T) {
	const full = `some warning from torch
{"epoch": 0, "test_accuracy": 0.8262, "loss": 0.3028, "elapsed_s": 3.2}
{"epoch": 1, "test_accuracy": 0.847, "loss": 0.304, "elapsed_s": 5.445}
{"epoch": 2, "test_accuracy": 0.8607, "loss": 0.4493, "elapsed_s": 8.189}
{"peer": "torch-ddp-gloo", "ranks": 4, "epochs": 3, "final_accuracy": 0.8607, "seconds_to_target": 8.189002414000242, "target": 0.85, "wall_s": 8.193, "process_wall_s": 11.993}
`
	ttt := 8.189002414000242
	for _, tc := range []struct {
		name    string
		out     string
		want    peerResult
		wantErr string
	}{
		{"full", full, peerResult{Peer: "torch-ddp-gloo", FinalAccuracy: 0.8607, SecondsToTarget: &ttt, WallS: 8.193, ProcessWallS: 11.993,
			Epochs: []peerEpoch{{ptr(0), 0.8262, 3.2}, {ptr(1), 0.847, 5.445}, {ptr(2), 0.8607, 8.189}}}, ""},
		{"target not reached", `{"epoch": 0, "test_accuracy": 0.8, "loss": 0.5, "elapsed_s": 3}
{"peer": "torch-ddp-gloo", "ranks": 4, "epochs": 1, "final_accuracy": 0.8, "seconds_to_target": null, "target": 0.85, "wall_s": 3, "process_wall_s": 6}`,
			peerResult{Peer: "torch-ddp-gloo", FinalAccuracy: 0.8, WallS: 3, ProcessWallS: 6, Epochs: []peerEpoch{{ptr(0), 0.8, 3}}}, ""},
		{"no result line", `{"epoch": 0, "test_accuracy": 0.8, "loss": 0.5, "elapsed_s": 3}`, peerResult{}, "no result line"},
		{"empty", "", peerResult{}, "no result line"},
		{"bad result line", `{"peer": "x", "final_accuracy": "high"}`, peerResult{}, "peer result line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePeer(tc.out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want []float64
	}{
		{`{"ms_per_epoch": [745.451, 754.027, 768.243], "threads": 1, "final_loss": 0.536437}` + "\n", []float64{745.451, 754.027, 768.243}},
		{`{"ms_per_epoch": [], "threads": 1}`, nil},
		{`{"ms_per_epoch": [12, -1]}`, nil},
		{"cohort-torch-ref-epoch: cannot read", nil},
	} {
		got, err := parseRef(tc.out)
		if (err != nil) != (tc.want == nil) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseRef(%q) = %v, %v; want %v", tc.out, got, err, tc.want)
		}
	}
}

func idxBytes(dims []uint32, data []byte) []byte {
	b := []byte{0, 0, 0x08, byte(len(dims))}
	for _, d := range dims {
		b = append(b, byte(d>>24), byte(d>>16), byte(d>>8), byte(d))
	}
	return append(b, data...)
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func TestReadIDX(t *testing.T) {
	img := idxBytes([]uint32{2, 2, 3}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	for _, tc := range []struct {
		name     string
		in       []byte
		wantDims []int
		wantErr  string
	}{
		{"raw", img, []int{2, 2, 3}, ""},
		{"gzipped", gz(img), []int{2, 2, 3}, ""},
		{"labels", idxBytes([]uint32{3}, []byte{7, 8, 9}), []int{3}, ""},
		{"bad magic", append([]byte{1}, img[1:]...), nil, "not an IDX file"},
		{"float elements", append([]byte{0, 0, 0x0d}, img[3:]...), nil, "element type 0x0d"},
		{"truncated", img[:len(img)-1], nil, "IDX data"},
		{"trailing bytes", append(img, 0), nil, "trailing bytes"},
		{"zero dimension", idxBytes([]uint32{0, 4}, nil), nil, "empty or over"},
		{"huge", idxBytes([]uint32{1 << 16, 1 << 16}, nil), nil, "empty or over"},
		{"short header", []byte{0, 0}, nil, "IDX header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dims, data, err := readIDX(bytes.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(dims, tc.wantDims) {
				t.Fatalf("dims %v, want %v", dims, tc.wantDims)
			}
			n := 1
			for _, d := range dims {
				n *= d
			}
			raw := tc.in
			if tc.name == "gzipped" {
				raw = img
			}
			if !bytes.Equal(data, raw[len(raw)-n:]) {
				t.Fatalf("data %v, want %v", data, raw[len(raw)-n:])
			}
		})
	}
}

// The generated config parses and carries exactly the compared settings.
func TestConfigHCL(t *testing.T) {
	def := config.Default()
	for _, tc := range []struct {
		name       string
		cfg        runConfig
		wantPolicy config.Policy
		wantEvery  int
	}{
		{"defaults", runConfig{Seed: 2, PluginDir: "/x/bin/plugins", Data: "/data/fm", Batch: 64, LR: 0.05, Threads: 1},
			def.Coordinator.Policy, def.Coordinator.SyncEvery},
		{"policy and sync_every", runConfig{Seed: 1, Policy: "cadence", SyncEvery: 25, Data: `/tmp/a "b" ${c}`, Batch: 32, LR: 0.1, Threads: 2},
			config.PolicyCadence, 25},
		{"a slow rank", runConfig{Seed: 1, Policy: "async", Data: "/d", Batch: 64, LR: 0.05, Threads: 1, SlowRank: 3, SlowDelay: 8500 * time.Microsecond},
			config.PolicyAsync, def.Coordinator.SyncEvery},
		{"cnn", runConfig{Seed: 1, Data: "/d", Model: "cnn", Optimizer: "sgd", Batch: 64, LR: 0.05, Threads: 1},
			def.Coordinator.Policy, def.Coordinator.SyncEvery},
		{"a TorchScript file with adamw", runConfig{Seed: 3, Data: "/d", Model: "/tmp/t-3.pt", Optimizer: "adamw", Batch: 64, LR: 0.002, Threads: 1},
			def.Coordinator.Policy, def.Coordinator.SyncEvery},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.cfg.hcl()
			c, err := config.Parse([]byte(src), "bench.hcl")
			if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			if c.Run.Seed != int64(tc.cfg.Seed) || c.Coordinator.Policy != tc.wantPolicy || c.Coordinator.SyncEvery != tc.wantEvery {
				t.Fatalf("run %+v coordinator %+v\n%s", c.Run, c.Coordinator, src)
			}
			if tc.cfg.PluginDir != "" && c.Worker.PluginDir != tc.cfg.PluginDir {
				t.Fatalf("plugin_dir %q", c.Worker.PluginDir)
			}
			if c.Trainer.Name != "libtorch" || c.Averager.Name != averager {
				t.Fatalf("trainer %q averager %q", c.Trainer.Name, c.Averager.Name)
			}
			var got map[string]any
			if err := json.Unmarshal(c.Trainer.Settings, &got); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{
				"model": "mlp", "hidden": []any{256.0}, "data": tc.cfg.Data, "batch_size": float64(tc.cfg.Batch),
				"optimizer": "sgd", "lr": tc.cfg.LR, "momentum": momentum, "threads": float64(tc.cfg.Threads),
			}
			if tc.cfg.Model != "" && tc.cfg.Model != "mlp" {
				want["model"] = tc.cfg.Model
				delete(want, "hidden")
			}
			if tc.cfg.Optimizer == "adamw" {
				want["optimizer"] = "adamw"
				delete(want, "momentum")
			}
			if tc.cfg.SlowDelay > 0 {
				want["sleep_per_batch_by_rank"] = map[string]any{"3": "8.5ms"}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("trainer settings %v, want %v", got, want)
			}
		})
	}
}

func TestMeanFigures(t *testing.T) {
	seed := func(c, p *float64, cAcc, pAcc float64) ddpSeed {
		return ddpSeed{ddpFigures: ddpFigures{CohortToTargetS: c, PeerToTargetS: p, CohortAccuracy: cAcc, PeerAccuracy: pAcc}}
	}
	m, paired, cr, pr := meanFigures([]ddpSeed{
		seed(ptr(3.0), ptr(9.0), 0.85, 0.86),
		seed(nil, ptr(6.0), 0.84, 0.86),
		seed(ptr(2.0), ptr(8.0), 0.86, 0.85),
	})
	if paired != 2 || cr != 2 || pr != 3 {
		t.Fatalf("paired %d, cohort reached %d, peer reached %d", paired, cr, pr)
	}
	if *m.CohortToTargetS != 2.5 || *m.PeerToTargetS != round3(23.0/3) || m.Ratio == nil || *m.Ratio != round4(5.0/17) {
		t.Fatalf("times %v %v ratio %v", *m.CohortToTargetS, *m.PeerToTargetS, m.Ratio)
	}
	if m.CohortAccuracy != 0.85 || m.AccDiffPoints != round3(100*(2.55-2.57)/3) {
		t.Fatalf("accuracy %v, diff %v", m.CohortAccuracy, m.AccDiffPoints)
	}
	for _, tc := range []struct {
		cohortReached, peerReached, seeds int
		ratio                             *float64
		want                              bool
	}{
		{3, 3, 3, ptr(0.5), true},
		{3, 3, 3, ptr(0.71), false},
		{2, 3, 3, ptr(0.3), false}, // cohort missed the target in a seed
		{3, 0, 3, nil, true},       // only cohort reached it
		{0, 0, 3, nil, false},
	} {
		if got := ratioPass(tc.cohortReached, tc.peerReached, tc.seeds, tc.ratio, 0.6); got != tc.want {
			t.Errorf("ratioPass(%d, %d, %d, %v) = %v", tc.cohortReached, tc.peerReached, tc.seeds, tc.ratio, got)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestCPUHalves(t *testing.T) {
	cases := []struct {
		cpus   []int
		need   int
		a, b   string
		wantOK bool
	}{
		{[]int{0, 1}, 2, "", "", false},
		{[]int{0, 1}, 1, "0", "1", true},
		{[]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 3, "0-7", "8-15", true},
		{[]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 9, "", "", false},
		{[]int{0, 2, 3, 5, 6}, 2, "0,2", "3,5", true}, // an odd CPU out
	}
	for _, c := range cases {
		a, b, ok := cpuHalves(c.cpus, c.need)
		if ok != c.wantOK || cpuList(a) != c.a || cpuList(b) != c.b {
			t.Errorf("cpuHalves(%v, %d) = %q %q %v, want %q %q %v", c.cpus, c.need, cpuList(a), cpuList(b), ok, c.a, c.b, c.wantOK)
		}
	}
}

// TestStartOn: a child started on a CPU set runs there, and so does its
// own child; the parent's other threads keep their mask.
func TestStartOn(t *testing.T) {
	cpus, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		t.Skip("one CPU: nothing to confine to")
	}
	want := cpus[len(cpus)-1:]
	// "; true" keeps sh from exec'ing grep in its place: grep is its child.
	cmd := exec.Command("sh", "-c", "grep Cpus_allowed_list /proc/self/status; true")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := startOn(cmd, want); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(strings.TrimPrefix(out.String(), "Cpus_allowed_list:")); got != cpuList(want) {
		t.Fatalf("child's grandchild runs on %q, want %q", got, cpuList(want))
	}
	after, err := allowedCPUs()
	if err != nil || len(after) != len(cpus) {
		t.Fatalf("this process's mask changed: %v -> %v (%v)", cpus, after, err)
	}
}

// The slow rank's processes: cohort's worker of that rank and everything
// below it; DDP's rank-th spawned child, once all ranks are there.
func TestSlowRankPickers(t *testing.T) {
	ps := []proctab.Proc{
		{PID: 10, PPID: 1, Args: []string{"cohort", "worker", "--rank", "0"}},
		{PID: 11, PPID: 1, Args: []string{"cohort", "worker", "--rank", "3"}},
		{PID: 12, PPID: 1, Args: []string{"cohort", "worker", "--rank", "13"}},
		{PID: 20, PPID: 11, Args: []string{"cohort-trainer-libtorch"}},
		{PID: 21, PPID: 20, Args: []string{"helper"}},
		{PID: 22, PPID: 10, Args: []string{"cohort-trainer-libtorch"}},
	}
	if got := cohortRankProcs(3)(ps); !slices.Equal(got, []int{11, 20, 21}) {
		t.Errorf("cohort rank 3: %v, want the worker 11 and its plugin tree 20, 21", got)
	}
	if got := cohortRankProcs(5)(ps); got != nil {
		t.Errorf("cohort rank 5 (none): %v", got)
	}
	spawn := func(pid int) proctab.Proc {
		return proctab.Proc{PID: pid, PPID: 1, Args: []string{"/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"}}
	}
	tracker := proctab.Proc{PID: 20, PPID: 1, Args: []string{"/usr/bin/python3", "-c", "from multiprocessing.resource_tracker import main;main(4)"}}
	if got := ddpRankProcs(3, 4)([]proctab.Proc{tracker, spawn(21), spawn(22), spawn(23)}); got != nil {
		t.Errorf("three of four ranks spawned: %v, want none yet", got)
	}
	if got := ddpRankProcs(3, 4)([]proctab.Proc{tracker, spawn(21), spawn(22), spawn(23), spawn(24)}); !slices.Equal(got, []int{24}) {
		t.Errorf("rank 3 of four: %v, want [24]", got)
	}
}

func TestParseMatrix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []matrixModel
		err  string
	}{
		{"mlp=5,cnn=5,transformer=3", []matrixModel{{"mlp", "sgd", 0, 5}, {"cnn", "sgd", 0, 5}, {"transformer", "adamw", 0.002, 3}}, ""},
		{"transformer=1, mlp=2", []matrixModel{{"mlp", "sgd", 0, 2}, {"transformer", "adamw", 0.002, 1}}, ""},
		{"cnn=0", nil, "seeds at least 1"},
		{"cnn", nil, "want model=seeds"},
		{"mlp=1,mlp=2", nil, "twice"},
		{"resnet=1", nil, "unknown model"},
	} {
		got, err := parseMatrix(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseMatrix(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseMatrix(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestCurveTargetAndToTarget(t *testing.T) {
	seeds := []ddpSeed{
		{PeerEpochAcc: []float64{0.84, 0.8712, 0.88}, PeerEpochS: []float64{5, 10, 15}, CohortEpochAcc: []float64{0.86, 0.87, 0.875}, CohortEpochS: []float64{3, 3, 3}},
		{PeerEpochAcc: []float64{0.85, 0.8698, 0.88}, PeerEpochS: []float64{5, 10, 15}, CohortEpochAcc: []float64{0.85, 0.86, 0.87}, CohortEpochS: []float64{3, 3, 3}},
	}
	// Epoch 2's mean is 87.05%: the target is 87.0%.
	if got := curveTarget(seeds, 3); got != 0.87 {
		t.Fatalf("curveTarget = %v, want 0.87", got)
	}
	// The peer's 84% at 5 s and 87.12% at 10 s cross 87% at 9.808 s.
	seeds[0].toTarget(0.87)
	if *seeds[0].CohortToTargetS != 6 || *seeds[0].PeerToTargetS != 9.808 || *seeds[0].Ratio != 0.6117 {
		t.Fatalf("seed 0: %v %v %v", *seeds[0].CohortToTargetS, *seeds[0].PeerToTargetS, *seeds[0].Ratio)
	}
	seeds[1].toTarget(0.87)
	if *seeds[1].CohortToTargetS != 9 || *seeds[1].PeerToTargetS != 10.098 {
		t.Fatalf("seed 1: %v %v", *seeds[1].CohortToTargetS, *seeds[1].PeerToTargetS)
	}
	seeds[1].toTarget(0.9)
	if seeds[1].CohortToTargetS != nil || seeds[1].PeerToTargetS != nil || seeds[1].Ratio != nil {
		t.Fatal("a target neither side reached has times")
	}
}

func TestRingBytesPerEpoch(t *testing.T) {
	// 4 ranks of batch 64: 234 steps each, 1.5 times the 4-byte gradients a step.
	if got := ringBytesPerEpoch(1000, 4, 64); got != 234*4000*1.5 {
		t.Fatalf("ringBytesPerEpoch = %v", got)
	}
	if got := ringBytesPerEpoch(1000, 1, 64); got != 0 {
		t.Fatalf("one rank sends %v", got)
	}
}
