package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// cohort validate reports every mistake of a file at once, each naming
// what is wrong where, and passes a good one.
func TestValidate(t *testing.T) {
	bin := cohortBinary(t)
	buildPlugin(t, "averaging-cpu")
	cases := []struct {
		name, src string
		code      int
		want      []string
	}{
		{"good", "trainer \"mock\" {}\naverager \"mock\" {}\n", 0, []string{"ok (trainer \"mock\", averager \"mock\")"}},
		{"every mistake", "run {\n  ranks = 0\n}\ntrainer \"nosuch\" {}\naverager \"mock\" {\n  version = \">= 9\"\n}\n", 2, []string{
			"cohort.hcl:2,3-8: run.ranks: must be at least 1, got 0",
			// An unknown plugin names the directories searched.
			"cohort.hcl:4,9-17: trainer: find trainer plugin \"nosuch\": no executable cohort-trainer-nosuch in bin/plugins, " + filepath.Join(filepath.Dir(bin), "plugins") + " or on PATH",
			"cohort.hcl:5,10-16: averager: averaging plugin \"mock\" (",
			"averager plugin \"mock\" is version 1, which does not satisfy the config's constraint \">= 9\"",
		}},
		// A mistake in decoding does not hide the others: every kind is
		// reported in one pass.
		{"one of each kind", "run {\n  ranks = \"four\"\n  epoch = 3\n}\ncoordinator {\n  heartbeat_timeout = \"soon\"\n  policy = \"fastest\"\n  sync_every = 0\n}\n" +
			"trainer \"mock\" {\n  lr = \"fast\"\n}\naverager \"nosuch\" {}\n", 2, []string{
			"is not valid: 7 mistakes",
			"cohort.hcl:2,3-8: run.ranks: a number is required",
			`cohort.hcl:3,3-8: run.epoch: unknown key; did you mean "epochs"?`,
			`cohort.hcl:6,3-20: coordinator.heartbeat_timeout: "soon" is not a duration`,
			`cohort.hcl:7,3-9: coordinator.policy: "fastest" is not one of sync, cadence, async`,
			"cohort.hcl:8,3-13: coordinator.sync_every: must be at least 1, got 0",
			`cohort.hcl:11,3-5: trainer.lr: a number, got the string "fast"`,
			"cohort.hcl:13,10-18: averager: find averager plugin \"nosuch\": no executable cohort-averaging-nosuch",
		}},
		// Values only the plugin can judge are its own to check
		// (CheckSettings), reported with the rest, each on its key's line.
		{"the plugin's own checks", "run {\n  ranks = \"four\"\n  epoch = 3\n}\ncoordinator {\n  heartbeat_timeout = \"soon\"\n  policy = \"fastest\"\n}\n" +
			"trainer \"mock\" {\n  lr = -5\n  batch_size = 0\n}\naverager \"nosuch\" {}\n", 2, []string{
			"is not valid: 7 mistakes",
			"cohort.hcl:2,3-8: run.ranks: a number is required",
			`cohort.hcl:3,3-8: run.epoch: unknown key; did you mean "epochs"?`,
			`cohort.hcl:6,3-20: coordinator.heartbeat_timeout: "soon" is not a duration`,
			`cohort.hcl:7,3-9: coordinator.policy: "fastest" is not one of sync, cadence, async`,
			"cohort.hcl:10,3-5: trainer.lr: lr = -5, want a finite number above 0",
			"cohort.hcl:11,3-13: trainer.batch_size: batch_size = 0, want at least 1",
			"cohort.hcl:13,10-18: averager: find averager plugin \"nosuch\": no executable cohort-averaging-nosuch",
		}},
		{"a bad enum value the averager refuses", "trainer \"mock\" {}\naverager \"cpu\" {\n  wire = \"fp8\"\n}\n", 2, []string{
			`cohort.hcl:3,3-7: averager.wire: wire = "fp8": want "f32" or "bf16"`,
		}},
		{"syntax", "run {\n  ranks = \n}\n", 2, []string{"cohort.hcl:2"}},
		// The plugins' settings are checked against the schemas they
		// declare, reported with the core's errors, each on its line.
		{"plugin settings", "run {\n  ranks = 0\n}\ntrainer \"mock\" {\n  lr = \"fast\"\n  batch_size = 1.5\n  sample = 10\n  optimizer = \"sgd\"\n}\n" +
			"averager \"mock\" {\n  sleep_per_round = \"soon\"\n}\n", 2, []string{
			"cohort.hcl:2,3-8: run.ranks: must be at least 1, got 0",
			`cohort.hcl:5,3-5: trainer.lr: a number, got the string "fast"`,
			"cohort.hcl:6,3-13: trainer.batch_size: an integer, got the number 1.5",
			`cohort.hcl:7,3-9: trainer.sample: unknown key; did you mean "samples"? trainer "mock" takes adaptive, batch_size, epoch_end_file, eval_samples,`,
			`cohort.hcl:8,3-12: trainer.optimizer: unknown key; trainer "mock" takes adaptive, batch_size,`,
			`cohort.hcl:11,3-18: averager.sleep_per_round: "soon" is not a duration like "30s" or "1m30s"`,
		}},
		{"plugin settings of the right types", "trainer \"mock\" {\n  lr = 0.5\n  batch_size = 8.0\n  sleep_per_batch = \"1ms\"\n  sleep_per_batch_by_rank = { \"1\" = \"2ms\" }\n}\n" +
			"averager \"mock\" {\n  lone_rounds = true\n}\n", 0, []string{"ok"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "cohort.hcl")
			if err := os.WriteFile(file, []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "validate", file)
			cmd.Dir = dir
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// cohort run checks the plugins before any rank starts: a mistaken block
// (or a missing plugin) ends it with exit status 2, naming the file, line
// and key, with no worker started and no out directory made.
func TestRunRefusesBadPluginsBeforeAnyRank(t *testing.T) {
	cfg := writeRunConfig(t, "", map[string]any{"lr": "fast"})
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"lr = \"fast\"", []string{"--config", cfg}, cfg + `:3,3-5: trainer.lr: a number, got the string "fast"`},
		{"no such plugin", []string{"--trainer", "nosuch", "--averaging", "mock"}, "no executable cohort-trainer-nosuch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			p := startCohort(t, append([]string{"run", "--ranks", "2", "--out", out}, tc.args...)...)
			start := time.Now()
			if code := p.wait(60 * time.Second); code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))
			if !strings.Contains(p.stderrText(), tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, p.stderrText())
			}
			if strings.Contains(p.stderrText(), "Usage:") {
				t.Errorf("a config error printed the usage text:\n%s", p.stderrText())
			}
			if rank := regexp.MustCompile(`(?m)\brank \d`); rank.MatchString(p.output()) || rank.MatchString(p.stderrText()) {
				t.Errorf("a rank started:\n%s\n%s", p.output(), p.stderrText())
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				logs, _ := filepath.Glob(filepath.Join(out, LogsDir, "rank-*.log"))
				t.Errorf("out directory %s was made (%v; rank logs %q)", out, err, logs)
			}
		})
	}
}

// -json (or --json) prints the same problems as the text, each with its
// file, line, column and key, and exits 2 as the text does; --config names
// the file as well as the argument.
func TestValidateJSON(t *testing.T) {
	bin := cohortBinary(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "cohort.hcl")
	src := "run {\n  epoch = 3\n}\ncoordinator {\n  policy = \"fastest\"\n}\ntrainer \"nosuch\" {}\naverager \"mock\" {}\n"
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, _ := cmd.Output()
		return string(out), cmd.ProcessState.ExitCode()
	}
	type problem struct {
		File         string
		Line, Column int
		Key, Message string
	}
	want := []problem{
		{file, 2, 3, "run.epoch", `unknown key; did you mean "epochs"? run takes ranks, epochs, seed, out`},
		{file, 5, 3, "coordinator.policy", `"fastest" is not one of sync, cadence, async`},
		{file, 7, 9, "trainer", ""},
	}
	for _, args := range [][]string{{"validate", "-json", file}, {"validate", "--config", file, "--json"}} {
		out, code := run(args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
		var got struct {
			File     string
			Valid    bool
			Problems []problem
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%q: %v:\n%s", args, err, out)
		}
		if got.Valid || got.File != file || len(got.Problems) != len(want) {
			t.Fatalf("%q: %+v, want %d problems", args, got, len(want))
		}
		for i, w := range want {
			g := got.Problems[i]
			if w.Message == "" { // the search path varies; the place does not
				w.Message = g.Message
			}
			if g != w {
				t.Errorf("%q: problem %d is %+v, want %+v", args, i, g, w)
			}
		}
	}
	if _, code := run("validate", "--config", file, filepath.Join(dir, "other.hcl")); code != exitUsage {
		t.Errorf("two files: exit %d, want %d", code, exitUsage)
	}
	good := filepath.Join(dir, "good.hcl")
	if err := os.WriteFile(good, []byte("trainer \"mock\" {}\naverager \"mock\" {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run("validate", "-json", "--config", good); code != 0 || !strings.Contains(out, `"valid": true`) || !strings.Contains(out, `"problems": []`) {
		t.Errorf("a good file: exit %d:\n%s", code, out)
	}
}

// The built-in plugins check what only they can judge, each mistake of a
// file in one pass with the core's: libtorch an unknown model and a
// negative rate, averaging-cpu a wire encoding it does not speak.
func TestValidateBuiltinPlugins(t *testing.T) {
	bin := cohortBinary(t)
	buildPlugin(t, "averaging-cpu")
	buildLibtorch(t)
	// A config names two plugins, so the averager's slot holds either an
	// unknown plugin or one whose executable is missing; the trainer is
	// the real libtorch, to judge its own values. Each file holds eight
	// kinds of mistake, the two files all nine.
	common := []string{
		"is not valid: 8 mistakes",
		"cohort.hcl:2,3-8: run.ranks: a number is required",
		`cohort.hcl:3,3-8: run.epoch: unknown key`,
		`cohort.hcl:6,3-20: coordinator.heartbeat_timeout: "soon" is not a duration`,
		`cohort.hcl:7,3-9: coordinator.policy: "fastest" is not one of sync, cadence, async`,
		`cohort.hcl:10,3-8: trainer.model: model = "resnet999" is not "mlp", "cnn" or a TorchScript file`,
		"cohort.hcl:11,3-5: trainer.lr: lr = -5, want a finite number above 0",
		"cohort.hcl:12,3-13: trainer.batch_size: batch_size = 0: want at least 1",
	}
	for _, c := range []struct {
		averager, want string
	}{
		{"nosuch", `cohort.hcl:14,10-18: averager: find averager plugin "nosuch": no executable cohort-averaging-nosuch`},
		{"gone", `cohort.hcl:14,10-16: averager: find averager plugin "gone": its executable is missing: ` +
			filepath.Join("bin", "plugins", "SHA256SUMS") + " lists cohort-averaging-gone, but the file is missing"},
	} {
		t.Run(c.averager, func(t *testing.T) {
			src := "run {\n  ranks = \"four\"\n  epoch = 3\n}\ncoordinator {\n  heartbeat_timeout = \"soon\"\n  policy = \"fastest\"\n}\n" +
				"trainer \"libtorch\" {\n  model = \"resnet999\"\n  lr = -5\n  batch_size = 0\n}\naverager \"" + c.averager + "\" {}\n"
			dir := t.TempDir()
			file := filepath.Join(dir, "cohort.hcl")
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			// An installed averager whose file was deleted since.
			plugins := filepath.Join(dir, "bin", "plugins")
			if err := os.MkdirAll(plugins, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(plugins, "SHA256SUMS"), []byte(strings.Repeat("ab", 32)+"  cohort-averaging-gone\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"validate", file}, {"validate", "-json", file}} {
				cmd := exec.Command(bin, args...)
				cmd.Dir = dir
				var stdout, both bytes.Buffer
				cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &both), &both
				cmd.Run()
				out := both.Bytes()
				if code := cmd.ProcessState.ExitCode(); code != exitUsage {
					t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
				}
				if args[1] == "-json" {
					// The same list: its keys, in the text's order.
					var got struct {
						Problems []struct{ Key string }
					}
					if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
						t.Fatalf("-json: %v:\n%s", err, out)
					}
					var keys []string
					for _, p := range got.Problems {
						keys = append(keys, p.Key)
					}
					want := []string{"run.ranks", "run.epoch", "coordinator.heartbeat_timeout", "coordinator.policy", "trainer.model", "trainer.lr", "trainer.batch_size", "averager"}
					if !slices.Equal(keys, want) {
						t.Errorf("-json lists the keys %q, want %q", keys, want)
					}
					continue
				}
				for _, w := range append(slices.Clone(common), c.want) {
					if !strings.Contains(string(out), w) {
						t.Errorf("output lacks %q:\n%s", w, out)
					}
				}
			}
		})
	}
}
