package trainer

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
)

func TestSettingsDefaults(t *testing.T) {
	for _, raw := range []string{"", "null", "{}", " { } "} {
		s, err := parseSettings([]byte(raw))
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if s.Model != "mlp" || !slices.Equal(s.Hidden, []int64{256}) || s.Loss != "cross_entropy" || s.Data != DefaultData ||
			s.BatchSize != 64 || s.Optimizer != "sgd" || *s.LR != 0.05 || *s.Momentum != 0.9 || *s.WeightDecay != 0 ||
			s.LRSchedule != "constant" || s.Threads != 0 || s.Device != "cpu" || *s.WidenMB != defaultWidenMB() {
			t.Fatalf("%q: defaults %+v", raw, s)
		}
	}
	s, err := parseSettings([]byte(`{"optimizer": "adamw"}`))
	if err != nil || *s.LR != 0.001 || *s.WeightDecay != 0.01 || !slices.Equal(s.Betas, []float64{0.9, 0.999}) || *s.Eps != 1e-8 {
		t.Fatalf("adamw defaults %+v %v", s, err)
	}
}

func TestSettingsErrors(t *testing.T) {
	cases := map[string]string{
		`{"learning_rate": 1}`:            `unknown key "learning_rate" (known keys: average_moments, batch_size, betas,`,
		`{"lr": 0.1} {}`:                  "trailing data",
		`{"lr": -1}`:                      "lr = -1",
		`{"batch_size": -1}`:              `key "batch_size": got a JSON number -1`,
		`{"batch_size": 0}`:               "batch_size = 0: want at least 1",
		`{"eval_batch_size": 0}`:          "eval_batch_size = 0: want at least 1",
		`{"model": "cnn", "hidden": [8]}`: "hidden applies to model = \"mlp\"",
		`{"hidden": [0]}`:                 "every width",
		`{"loss": "hinge"}`:               "loss = \"hinge\"",
		`{"data": "/x", "data_x": "a.npy", "data_y": "b.npy"}`: "not both",
		`{"data_x": "a.npy"}`:                                             "data_x and data_y go together",
		`{"data_x": "a", "data_y": "b", "eval_x": "c"}`:                   "eval_x and eval_y go together",
		`{"optimizer": "lbfgs"}`:                                          "optimizer = \"lbfgs\"",
		`{"optimizer": "adam", "momentum": 0.9}`:                          "momentum and nesterov apply to optimizer = \"sgd\"",
		`{"betas": [0.9, 0.99]}`:                                          "betas, eps, average_moments and cohort_second_moment apply",
		`{"optimizer": "adam", "betas": [0.9]}`:                           "two values",
		`{"momentum": 1}`:                                                 "momentum = 1",
		`{"momentum": 0, "nesterov": true}`:                               "nesterov needs",
		`{"lr_schedule": "cosine"}`:                                       "needs lr_total_steps",
		`{"lr_schedule": "step"}`:                                         "needs lr_step_size",
		`{"lr_schedule": "linear"}`:                                       "lr_schedule = \"linear\"",
		`{"lr_total_steps": 10}`:                                          "need lr_schedule",
		`{"lr_schedule": "cosine", "lr_total_steps": 9, "lr_gamma": 0.5}`: "apply to lr_schedule = \"step\"",
		`{"lr_schedule": "cosine", "lr_total_steps": 9, "lr_min": 1}`:     "lr_min = 1",
		`{"threads": -1}`:                                                 "threads = -1",
		`{"device": "tpu"}`:                                               "device = \"tpu\"",
		`{"sleep_per_batch_by_rank": {"x": "1ms"}}`:                       "not a rank number",
		`{"sleep_per_batch_by_rank": {"1": "fast"}}`:                      "want a duration from 0",
		`{"sleep_per_batch_by_rank": {"1": "1h"}}`:                        "want a duration from 0",
		`{"max_grad_norm": -1}`:                                           "max_grad_norm",
		`{"input_shape": [1, 0]}`:                                         "input_shape",
		`{"outputs": -2}`:                                                 "outputs = -2",
		`{"widen_mb": -1}`:                                                "widen_mb = -1",
		`{"widen_mb": 9223372036854775807}`:                               "widen_mb = 9223372036854775807",
	}
	for raw, want := range cases {
		if _, err := parseSettings([]byte(raw)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
}

// TestSettingsREADME checks that the README documents every key.
func TestSettingsREADME(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range plugin.SettingKeys(Settings{}) {
		if !regexp.MustCompile("\\| `" + k + "` ").Match(readme) {
			t.Errorf("README.md does not document the setting %q in its table", k)
		}
	}
}

func TestSchedules(t *testing.T) {
	parse := func(raw string) Settings {
		s, err := parseSettings([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	c := parse(`{"lr": 0.1}`)
	if c.lrAt(0) != 0.1 || c.lrAt(1e9) != 0.1 {
		t.Fatal("constant")
	}
	cos := parse(`{"lr": 0.1, "lr_schedule": "cosine", "lr_total_steps": 100, "lr_min": 0.01}`)
	if !near(cos.lrAt(0), 0.1) || !near(cos.lrAt(50), 0.055) || !near(cos.lrAt(100), 0.01) || !near(cos.lrAt(500), 0.01) {
		t.Fatalf("cosine %v %v %v", cos.lrAt(0), cos.lrAt(50), cos.lrAt(100))
	}
	st := parse(`{"lr": 0.1, "lr_schedule": "step", "lr_step_size": 10, "lr_gamma": 0.5}`)
	if !near(st.lrAt(9), 0.1) || !near(st.lrAt(10), 0.05) || !near(st.lrAt(25), 0.025) {
		t.Fatalf("step %v %v %v", st.lrAt(9), st.lrAt(10), st.lrAt(25))
	}
	w := parse(`{"lr": 0.1, "lr_warmup_steps": 4}`)
	if !near(w.lrAt(0), 0.025) || !near(w.lrAt(3), 0.1) || !near(w.lrAt(4), 0.1) {
		t.Fatalf("warmup %v %v", w.lrAt(0), w.lrAt(3))
	}
}

func TestDefaultThreads(t *testing.T) {
	if n := defaultThreads(0); n < 1 {
		t.Fatal(n)
	}
	if n := defaultThreads(1 << 20); n != 1 {
		t.Fatalf("a million local ranks: %d threads", n)
	}
}

// CheckSettings reports every refused key of a block, not only the first
// parseSettings meets, each under its key.
func TestCheckSettingsReportsEveryKey(t *testing.T) {
	raw := []byte(`{"model": "resnet999", "lr": -5, "batch_size": 0, "loss": "hinge", "threads": 2}`)
	problems, err := (&Trainer{}).CheckSettings(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range problems {
		got[p.Key] = p.Message
	}
	for key, want := range map[string]string{
		"model":      `model = "resnet999"`,
		"lr":         "lr = -5",
		"batch_size": "batch_size = 0",
		"loss":       `loss = "hinge"`,
	} {
		if !strings.Contains(got[key], want) {
			t.Errorf("problem of %s: %q, want it to say %q (all: %+v)", key, got[key], want, problems)
		}
	}
	if len(problems) != 4 {
		t.Errorf("%d problems, want 4: %+v", len(problems), problems)
	}
	if problems, _ := (&Trainer{}).CheckSettings(context.Background(), []byte(`{"lr": 0.1}`)); len(problems) != 0 {
		t.Errorf("a good block: %+v", problems)
	}
}
