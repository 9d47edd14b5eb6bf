package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

const fullFile = `run {
  ranks  = 8
  epochs = 5
  seed   = 42
  out    = "runs/exp1"
}
coordinator {
  listen            = "0.0.0.0:7700"
  http              = "0.0.0.0:7780"
  heartbeat_timeout = "10s"
  formation_timeout = "2m"
  policy            = "cadence"
  sync_every        = 20
  min_ranks         = 2
  checkpoint_every  = 1
  checkpoint_keep   = 0
  eval_rank         = "fastest"
  eval_every        = 2
  chunk_batches     = 16
  overhead_target   = 0.05
  easgd_alpha       = 0.25
  async_overlap     = false
  adaptive_sync     = false
  sync_every_min    = 5
  sync_every_max    = 80
  divergence_target = 0.02
  guard_factor      = 4
  guard_lr_factor   = 0.25
  lr_plateau_patience = 2
  lr_plateau_factor   = 0.1
  max_batch_diff    = 30
}
worker {
  liveness_timeout = "15s"
  connect_timeout  = "45s"
  plugin_dir       = "/opt/cohort/plugins"
  shutdown_grace   = "1500ms"
  plugin_lock      = "/etc/cohort/cohort.lock.json"
  plugin_restarts  = 1
}
trainer "libtorch" {
  version    = ">= 1.2, < 2"
  model      = "mlp"
  batch_size = 64
  lr         = 0.05
}
averager "fabric" {
  gamma = 1.0
  wire  = "f32"
}
`

func mustParse(t *testing.T, src, name string) *Config {
	t.Helper()
	c, err := Parse([]byte(src), name)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestParseFull(t *testing.T) {
	c := mustParse(t, fullFile, "cohort.hcl")
	want := Config{
		Run: Run{Ranks: 8, Epochs: 5, Seed: 42, Out: "runs/exp1"},
		Coordinator: Coordinator{
			Listen:            "0.0.0.0:7700",
			HTTP:              "0.0.0.0:7780",
			HeartbeatTimeout:  10 * time.Second,
			FormationTimeout:  2 * time.Minute,
			Policy:            PolicyCadence,
			SyncEvery:         20,
			MinRanks:          2,
			CheckpointEvery:   1,
			ChunkBatches:      16,
			OverheadTarget:    0.05,
			EASGDAlpha:        0.25,
			SyncEveryMin:      5,
			SyncEveryMax:      80,
			DivergenceTarget:  0.02,
			GuardFactor:       4,
			GuardLRFactor:     0.25,
			LRPlateauPatience: 2,
			LRPlateauFactor:   0.1,
			MaxBatchDiff:      30,
			EvalRank:          EvalRankFastest,
			EvalEvery:         2,
		},
		Worker: Worker{
			LivenessTimeout: 15 * time.Second,
			ConnectTimeout:  45 * time.Second,
			PluginDir:       "/opt/cohort/plugins",
			ShutdownGrace:   1500 * time.Millisecond,
			PluginLock:      "/etc/cohort/cohort.lock.json",
			PluginRestarts:  1,
		},
		// version is the core's, not passed to the plugin.
		Trainer:  Plugin{Name: "libtorch", Settings: json.RawMessage(`{"batch_size":64,"lr":0.05,"model":"mlp"}`), Version: ">= 1.2, < 2"},
		Averager: Plugin{Name: "fabric", Settings: json.RawMessage(`{"gamma":1,"wire":"f32"}`)},
		Path:     "cohort.hcl",
	}
	checkSame(t, c, &want)
}

// checkSame compares everything but the recorded source positions.
func checkSame(t *testing.T, got, want *Config) {
	t.Helper()
	g, w := *got, *want
	g.where, w.where = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got\n%+v\n(trainer %s, averager %s)\nwant\n%+v\n(trainer %s, averager %s)",
			g, g.Trainer.Settings, g.Averager.Settings, w, w.Trainer.Settings, w.Averager.Settings)
	}
}

func TestPluginSettingsJSON(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty", ``, `{}`},
		{"integers", `a = 64
			b = -3
			c = 1e3
			d = 12345678901234567890`, `{"a":64,"b":-3,"c":1000,"d":12345678901234567890}`},
		{"fractions", `lr = 0.05
			eps = 1.5e-7
			third = 1/3`, `{"eps":1.5e-07,"lr":0.05,"third":0.3333333333333333}`},
		{"strings", `s = "say \"hi\" <&> \u00e9"
			path = "/usr/share/datasets/fashion-mnist"`,
			`{"path":"/usr/share/datasets/fashion-mnist","s":"say \"hi\" <&> é"}`},
		{"bools and null", `t = true
			f = false
			n = null`, `{"f":false,"n":null,"t":true}`},
		{"lists", `xs = [1, 2, 3]
			mixed = ["a", true, null, 0.5]
			none = []`, `{"mixed":["a",true,null,0.5],"none":[],"xs":[1,2,3]}`},
		{"nested objects", `opt = {
				name = "sgd"
				momentum = 0.9
				schedule = { kind = "cosine", steps = [100, 200] }
				layers = [{ w = 1 }, { w = 2 }]
			}`, `{"opt":{"layers":[{"w":1},{"w":2}],"momentum":0.9,"name":"sgd","schedule":{"kind":"cosine","steps":[100,200]}}}`},
		{"template without variables", `s = "n=${1 + 2}"`, `{"s":"n=3"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, "trainer \"t\" {\n"+tc.body+"\n}\n", "t.hcl")
			if got := string(c.Trainer.Settings); got != tc.want {
				t.Errorf("settings\n got %s\nwant %s", got, tc.want)
			}
			if !json.Valid(c.Trainer.Settings) {
				t.Errorf("settings are not valid JSON: %s", c.Trainer.Settings)
			}
			if c.Trainer.Name != "t" {
				t.Errorf("name %q", c.Trainer.Name)
			}
		})
	}
}

func TestSwapAveragerChangesOnlyAverager(t *testing.T) {
	cpu := mustParse(t, fullFile, "cohort.hcl")
	swapped := strings.Replace(fullFile, `averager "fabric" {
  gamma = 1.0
  wire  = "f32"
}`, `averager "mock" {
  fail_round = 3
}`, 1)
	mock := mustParse(t, swapped, "cohort.hcl")
	if mock.Averager.Name != "mock" || string(mock.Averager.Settings) != `{"fail_round":3}` {
		t.Errorf("averager = %s %s", mock.Averager.Name, mock.Averager.Settings)
	}
	mock.Averager = cpu.Averager
	checkSame(t, mock, cpu)
}

func TestDefaults(t *testing.T) {
	d := Default()
	want := Config{
		Run: Run{Ranks: 4, Epochs: 3, Seed: 1, Out: "runs/latest"},
		Coordinator: Coordinator{
			Listen:           "127.0.0.1:0",
			HTTP:             "127.0.0.1:0",
			HeartbeatTimeout: 30 * time.Second,
			FormationTimeout: 60 * time.Second,
			Policy:           PolicySync,
			SyncEvery:        10,
			MinRanks:         1,
			CheckpointEvery:  1,
			CheckpointKeep:   3,
			OverheadTarget:   0.1,
			EASGDAlpha:       0.5,
			AsyncOverlap:     true,
			AdaptiveSync:     true,
			SyncEveryMin:     1,
			DivergenceTarget: 0,
			GuardFactor:      3,
			GuardLRFactor:    0.5,
			LRPlateauFactor:  0.5,
			EvalRank:         EvalRankLowest,
			EvalEvery:        1,
		},
		Worker: Worker{
			LivenessTimeout: 30 * time.Second,
			ConnectTimeout:  30 * time.Second,
			PluginDir:       "bin/plugins",
			ShutdownGrace:   5 * time.Second,
			PluginLock:      "cohort.lock.json",
			PluginRestarts:  3,
		},
		// The plugins are the ones the embedded file names: the core
		// names none itself.
		Trainer:  Plugin{Name: blockLabel(t, "trainer"), Settings: json.RawMessage(`{"model":"mlp"}`)},
		Averager: Plugin{Name: blockLabel(t, "averager"), Settings: json.RawMessage(`{}`)},
	}
	checkSame(t, d, &want)
	if err := d.Validate(); err != nil {
		t.Errorf("default does not validate: %v", err)
	}

	// Each call is a fresh copy.
	d.Trainer.Settings[2] = 'X'
	d.Run.Ranks = 99
	checkSame(t, Default(), &want)

	// An empty file is the default; DefaultFile parses to it.
	want.Path = "empty.hcl"
	checkSame(t, mustParse(t, "", "empty.hcl"), &want)
	want.Path = "default.hcl"
	checkSame(t, mustParse(t, string(DefaultFile()), "default.hcl"), &want)

	// A partial file keeps every other default.
	p := mustParse(t, "run {\n  ranks = 2\n}\ncoordinator {\n  policy = \"async\"\n}\n", "p.hcl")
	want.Path = "p.hcl"
	want.Run.Ranks = 2
	want.Coordinator.Policy = PolicyAsync
	checkSame(t, p, &want)
}

func TestValidationErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		where     string // the error's text starts with this: file:line,cols: key:
		msg       string // and carries this
	}{
		{"ranks zero", "run {\n  ranks = 0\n}\n", "cohort.hcl:2,3-8: run.ranks: ", "must be at least 1, got 0"},
		{"epochs negative", "run {\n  epochs = -1\n}\n", "cohort.hcl:2,3-9: run.epochs: ", "must be at least 1"},
		{"ranks fraction", "run {\n  ranks = 2.5\n}\n", "cohort.hcl:2,3-8: run.ranks: ", "whole number"},
		{"ranks string", "run {\n  ranks = \"four\"\n}\n", "cohort.hcl:2,3-8: run.ranks: ", "a number is required"},
		{"ranks null", "run {\n  ranks = null\n}\n", "cohort.hcl:2,3-8: run.ranks: ", "not null"},
		{"variable", "run {\n  ranks = n\n}\n", "cohort.hcl:2,11-12: run.ranks: ", "Variables not allowed"},
		{"unknown run key", "run {\n  rank = 2\n}\n", "cohort.hcl:2,3-7: run.rank: ", "unknown key; did you mean \"ranks\"? run takes ranks, epochs, seed, out"},
		{"policy", "coordinator {\n\n\n\n\n\n  policy = \"fast\"\n}\n", "cohort.hcl:7,3-9: coordinator.policy: ", `"fast" is not one of sync, cadence, async`},
		{"sync_every", "coordinator {\n  sync_every = 0\n}\n", "cohort.hcl:2,3-13: coordinator.sync_every: ", "must be at least 1"},
		{"http not host:port", "coordinator {\n  http = \"8080\"\n}\n", "cohort.hcl:2,3-7: coordinator.http: ", "is not host:port"},
		{"reduce_port", "coordinator {\n  reduce_port = 70000\n}\n", "cohort.hcl:2,3-14: coordinator.reduce_port: ", "must be a port number, 0 to 65535, got 70000"},
		{"min_ranks above ranks", "run {\n  ranks = 4\n}\ncoordinator {\n  min_ranks = 5\n}\n", "cohort.hcl:5,3-12: coordinator.min_ranks: ", "5 is outside [1, run.ranks = 4]"},
		{"min_ranks zero", "coordinator {\n  min_ranks = 0\n}\n", "cohort.hcl:2,3-12: coordinator.min_ranks: ", "outside"},
		{"heartbeat below 1s", "coordinator {\n  heartbeat_timeout = \"500ms\"\n}\n", "cohort.hcl:2,3-20: coordinator.heartbeat_timeout: ", "at least 1s, got 500ms"},
		{"not a duration", "coordinator {\n  heartbeat_timeout = 30\n}\n", "cohort.hcl:2,3-20: coordinator.heartbeat_timeout: ", `"30" is not a duration`},
		{"formation zero", "coordinator {\n  formation_timeout = \"0s\"\n}\n", "cohort.hcl:2,3-20: coordinator.formation_timeout: ", "positive duration"},
		{"checkpoint_every", "coordinator {\n  checkpoint_every = -1\n}\n", "cohort.hcl:2,3-19: coordinator.checkpoint_every: ", "at least 0"},
		{"checkpoint_keep", "coordinator {\n  checkpoint_keep = -1\n}\n", "cohort.hcl:2,3-18: coordinator.checkpoint_keep: ", "at least 0"},
		{"chunk_batches", "coordinator {\n  chunk_batches = -2\n}\n", "cohort.hcl:2,3-16: coordinator.chunk_batches: ", "at least 0"},
		{"eval_rank unknown", "coordinator {\n  eval_rank = \"quickest\"\n}\n", "cohort.hcl:2,3-12: coordinator.eval_rank: ", `"quickest" is not lowest, fastest or a rank number`},
		{"eval_rank negative", "coordinator {\n  eval_rank = -1\n}\n", "cohort.hcl:2,3-12: coordinator.eval_rank: ", `"-1" is not lowest, fastest or a rank number`},
		{"eval_rank past the ranks", "run {\n  ranks = 4\n}\ncoordinator {\n  eval_rank = \"4\"\n}\n", "cohort.hcl:5,3-12: coordinator.eval_rank: ", "rank 4 is not in the run: run.ranks = 4 numbers them 0 to 3"},
		{"eval_rank empty", "coordinator {\n  eval_rank = \"\"\n}\n", "cohort.hcl:2,3-12: coordinator.eval_rank: ", `"" is not lowest, fastest or a rank number`},
		{"eval_every negative", "coordinator {\n  eval_every = -1\n}\n", "cohort.hcl:2,3-13: coordinator.eval_every: ", "must be a number of epochs, or 0 to never evaluate, got -1"},
		{"overhead one", "coordinator {\n  overhead_target = 1\n}\n", "cohort.hcl:2,3-18: coordinator.overhead_target: ", "1 is outside (0, 1)"},
		{"overhead zero", "coordinator {\n  overhead_target = 0\n}\n", "cohort.hcl:2,3-18: coordinator.overhead_target: ", "outside (0, 1)"},
		{"overhead out of range", "coordinator {\n  overhead_target = 1e999\n}\n", "cohort.hcl:2,21-26: coordinator.overhead_target: ", "number is out of a float64's range"},
		{"alpha zero", "coordinator {\n  easgd_alpha = 0\n}\n", "cohort.hcl:2,3-14: coordinator.easgd_alpha: ", "0 is outside (0, 1]"},
		{"alpha above one", "coordinator {\n  easgd_alpha = 1.5\n}\n", "cohort.hcl:2,3-14: coordinator.easgd_alpha: ", "1.5 is outside (0, 1]"},
		{"sync_every_min zero", "coordinator {\n  sync_every_min = 0\n}\n", "cohort.hcl:2,3-17: coordinator.sync_every_min: ", "at least 1"},
		{"sync_every_min above sync_every", "coordinator {\n  sync_every_min = 12\n}\n", "cohort.hcl:2,3-17: coordinator.sync_every_min: ", "12 is above sync_every (10)"},
		{"sync_every_max below sync_every", "coordinator {\n  sync_every_max = 5\n}\n", "cohort.hcl:2,3-17: coordinator.sync_every_max: ", "5 is below sync_every_min (1) or sync_every (10)"},
		{"divergence_target negative", "coordinator {\n  divergence_target = -0.01\n}\n", "cohort.hcl:2,3-20: coordinator.divergence_target: ", "want 0 (the default for the trainer's optimizer) or a finite number above 0"},
		{"guard_factor one", "coordinator {\n  guard_factor = 1\n}\n", "cohort.hcl:2,3-15: coordinator.guard_factor: ", "want 0 (no guard) or a finite number above 1"},
		{"guard_lr_factor zero", "coordinator {\n  guard_lr_factor = 0\n}\n", "cohort.hcl:2,3-18: coordinator.guard_lr_factor: ", "0 is outside (0, 1]"},
		{"lr_plateau_patience negative", "coordinator {\n  lr_plateau_patience = -1\n}\n", "cohort.hcl:2,3-22: coordinator.lr_plateau_patience: ", "at least 0"},
		{"lr_plateau_factor one", "coordinator {\n  lr_plateau_factor = 1\n}\n", "cohort.hcl:2,3-20: coordinator.lr_plateau_factor: ", "1 is outside (0, 1)"},
		{"max_batch_diff negative", "coordinator {\n  max_batch_diff = -3\n}\n", "cohort.hcl:2,3-17: coordinator.max_batch_diff: ", "at least 0"},
		{"adaptive_sync not a bool", "coordinator {\n  adaptive_sync = \"yes\"\n}\n", "cohort.hcl:2,", "coordinator.adaptive_sync"},
		{"listen no port", "coordinator {\n  listen = \"localhost\"\n}\n", "cohort.hcl:2,3-9: coordinator.listen: ", "missing port"},
		{"listen bad port", "coordinator {\n  listen = \"127.0.0.1:99999\"\n}\n", "cohort.hcl:2,3-9: coordinator.listen: ", `port "99999"`},
		{"unknown coordinator key", "coordinator {\n  polcy = \"sync\"\n}\n", "cohort.hcl:2,3-8: coordinator.polcy: ", "unknown key; did you mean \"policy\"?"},
		{"liveness negative", "worker {\n  liveness_timeout = \"-1s\"\n}\n", "cohort.hcl:2,3-19: worker.liveness_timeout: ", "positive duration"},
		{"shutdown_grace zero", "worker {\n  shutdown_grace = \"0\"\n}\n", "cohort.hcl:2,3-17: worker.shutdown_grace: ", "positive duration"},
		{"plugin_restarts negative", "worker {\n  plugin_restarts = -1\n}\n", "cohort.hcl:2,3-18: worker.plugin_restarts: ", "must be at least 0, got -1"},
		{"plugin_dir empty", "worker {\n  plugin_dir = \"\"\n}\n", "cohort.hcl:2,3-13: worker.plugin_dir: ", "must not be empty"},
		{"bad version constraint", "trainer \"t\" {\n  lr = 1\n  version = \">= banana\"\n}\n", "cohort.hcl:3,3-10: trainer.version: ", `">= banana" is not a version constraint`},
		{"version not a string", "averager \"a\" {\n  version = [1]\n}\n", "cohort.hcl:2,3-10: averager.version: ", "string required"},
		{"block in core block", "worker {\n  x {}\n}\n", "cohort.hcl:2,3-4: worker: ", `Unexpected "x" block`},
		{"trainer name", "trainer \"Lib Torch\" {\n}\n", "cohort.hcl:1,9-20: trainer: ", `"Lib Torch" is not a plugin name`},
		{"averager name empty", "averager \"\" {\n}\n", "cohort.hcl:1,10-12: averager: ", `"" is not a plugin name`},
		{"plugin function call", "trainer \"t\" {\n  lr = max(1, 2)\n}\n", "cohort.hcl:2,8-17: trainer.lr: ", "Function calls not allowed"},
		{"plugin number out of range", "trainer \"t\" {\n  lr = 1e999\n}\n", "cohort.hcl:2,8-13: trainer.lr: ", "number is out of a float64's range"},
		{"plugin product out of range", "trainer \"t\" {\n  lr = 1e300 * 1e300\n}\n", "cohort.hcl:2,8-21: trainer.lr: ", "number is out of a float64's range"},
		{"huge literal refused before evaluating", "trainer \"t\" {\n  a = 1e600000000 % 3\n}\n", "cohort.hcl:2,7-18: trainer.a: ", "number is out of a float64's range"},
		{"tiny literal", "run {\n  seed = 1e-400\n}\n", "cohort.hcl:2,10-16: run.seed: ", "number is out of a float64's range"},
		{"second averager", "averager \"cpu\" {}\n\naverager \"mock\" {}\n", "cohort.hcl:3,1-16: averager: ", "a second averager block; the first is at cohort.hcl:1,1-15"},
		{"second run", "run {}\nrun {}\n", "cohort.hcl:2,1-4: run: ", "the first is at cohort.hcl:1,1-4"},
		{"unknown block", "runn {}\n", "cohort.hcl:1,1-5: ", `Blocks of type "runn" are not expected here`},
		{"top-level key", "ranks = 4\n", "cohort.hcl:1,1-6: ", `An argument named "ranks" is not expected here`},
		{"syntax", "run {\n  ranks = \n", "cohort.hcl:2,", "Invalid expression"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.src), "cohort.hcl")
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			if c != nil {
				t.Error("a config came back with the error")
			}
			first := strings.SplitN(err.Error(), "\n", 2)[0]
			if !strings.HasPrefix(first, tc.where) || !strings.Contains(first, tc.msg) {
				t.Errorf("error\n %q\nwant it to start with %q and carry %q", err, tc.where, tc.msg)
			}
			var e *Error
			if !errors.As(err, &e) || e.Range.Filename != "cohort.hcl" || e.Range.Start.Line == 0 {
				t.Errorf("error %#v carries no file and line", e)
			}
		})
	}
}

func TestParseRefusesHugeFiles(t *testing.T) {
	src := strings.Repeat("# padding\n", MaxFileSize/10+1)
	if _, err := Parse([]byte(src), "big.hcl"); err == nil || !strings.HasPrefix(err.Error(), "big.hcl: ") {
		t.Errorf("error %v, want one naming big.hcl", err)
	}
}

func TestValidationReportsEveryProblemInOrder(t *testing.T) {
	_, err := Parse([]byte("coordinator {\n  policy = \"fast\"\n  listen = \"x\"\n}\nrun {\n  ranks = 0\n}\n"), "c.hcl")
	got := strings.Split(err.Error(), "\n")
	want := []string{"c.hcl:2,3-9: coordinator.policy:", "c.hcl:3,3-9: coordinator.listen:", "c.hcl:6,3-8: run.ranks:"}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(got), len(want), err)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("error %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
}

func TestApply(t *testing.T) {
	ptr := func(n int) *int { return &n }
	base := func() *Config {
		return mustParse(t, "coordinator {\n  min_ranks = 3\n}\n"+
			"trainer \"libtorch\" {\n  lr = 0.1\n}\naverager \"cpu\" {\n  gamma = 0.5\n}\n", "cohort.hcl")
	}

	c := base()
	out := "runs/x"
	if err := c.Apply(Overrides{Ranks: ptr(6), Epochs: ptr(9), Out: &out, Trainer: "libtorch", Averager: "nccl"}); err != nil {
		t.Fatal(err)
	}
	if c.Run.Ranks != 6 || c.Run.Epochs != 9 || c.Run.Out != "runs/x" {
		t.Errorf("run = %+v", c.Run)
	}
	if c.Trainer.Name != "libtorch" || string(c.Trainer.Settings) != `{"lr":0.1}` {
		t.Errorf("same trainer name should keep its settings: %s %s", c.Trainer.Name, c.Trainer.Settings)
	}
	if c.Averager.Name != "nccl" || string(c.Averager.Settings) != `{}` {
		t.Errorf("another averager should start with no settings: %s %s", c.Averager.Name, c.Averager.Settings)
	}

	// Empty overrides change nothing.
	c, before := base(), base()
	if err := c.Apply(Overrides{}); err != nil {
		t.Fatal(err)
	}
	checkSame(t, c, before)

	for _, tc := range []struct {
		name string
		o    Overrides
		want string
	}{
		{"ranks zero", Overrides{Ranks: ptr(0)}, "--ranks: run.ranks: must be at least 1, got 0"},
		{"ranks below the file's min_ranks", Overrides{Ranks: ptr(2)}, "cohort.hcl:2,3-12: coordinator.min_ranks: 3 is outside [1, run.ranks = 2]"},
		{"epochs zero", Overrides{Epochs: ptr(0)}, "--epochs: run.epochs: must be at least 1"},
		{"bad averager name", Overrides{Averager: "NC CL"}, `--averaging: averager: "NC CL" is not a plugin name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			err := c.Apply(tc.o)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %v, want one starting %q", err, tc.want)
			}
			checkSame(t, c, base()) // unchanged on error
		})
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cohort.hcl")
	if err := os.WriteFile(path, []byte(fullFile), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Path != path || c.Run.Ranks != 8 {
		t.Errorf("Path %q, ranks %d", c.Path, c.Run.Ranks)
	}

	if err := os.WriteFile(path, []byte("run {\n  ranks = 0\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.HasPrefix(err.Error(), path+":2,3-8: run.ranks:") {
		t.Errorf("error %v does not name %s and the line", err, path)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.hcl")); err == nil {
		t.Error("no error for a missing file")
	}
}

// blockLabel is the label of DefaultFile's block of type typ.
func blockLabel(t *testing.T, typ string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + typ + ` "([^"]+)"`).FindSubmatch(DefaultFile())
	if m == nil {
		t.Fatalf("DefaultFile has no %s block", typ)
	}
	return string(m[1])
}
