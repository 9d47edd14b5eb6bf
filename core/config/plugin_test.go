package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
)

// Each setting type takes the HCL values that reach the plugin as its JSON
// type and refuses the rest, naming the file, line and key.
func TestCheckPluginSettings(t *testing.T) {
	schema := []plugin.SettingSpec{
		{Key: "name", Type: plugin.SettingString},
		{Key: "lr", Type: plugin.SettingNumber},
		{Key: "batch_size", Type: plugin.SettingInteger},
		{Key: "nesterov", Type: plugin.SettingBool},
		{Key: "timeout", Type: plugin.SettingDuration},
		{Key: "by_rank", Type: plugin.SettingObject},
		{Key: "hidden", Type: plugin.SettingArray},
		{Key: "extra", Type: plugin.SettingAny},
		{Key: "future", Type: "a-type-from-a-newer-plugin"},
	}
	cases := []struct {
		name, body string
		schema     []plugin.SettingSpec // nil: schema
		want       []string             // each error, in order; none: valid
	}{
		{"empty block", "", nil, nil},
		{"every type right", `
  name = "mlp"
  lr = 0.05
  batch_size = 64
  nesterov = true
  timeout = "1m30s"
  by_rank = { "0" = "10ms", "1" = { deep = [1, 2] } }
  hidden = [256, 128]
  extra = [1, "two"]
  future = "anything"
`, nil, nil},
		{"integers: whole numbers, big ones too, however written", "  batch_size = 64.0\n  lr = 1e3\n", nil, nil},
		{"arithmetic is evaluated first", "  batch_size = 3 * 2\n  lr = 1 / 4\n", nil, nil},
		{"null keeps the plugin's default", "  lr = null\n  timeout = null\n", nil, nil},
		{"an empty list and object", "  hidden = []\n  by_rank = {}\n", nil, nil},
		{"a string for a number", "  lr = \"fast\"\n", nil,
			[]string{`cohort.hcl:3,3-5: trainer.lr: a number, got the string "fast"`}},
		{"a numeric string is still a string: the plugin would refuse it", "  lr = \"0.1\"\n", nil,
			[]string{`cohort.hcl:3,3-5: trainer.lr: a number, got the string "0.1"`}},
		{"a fraction for an integer", "  batch_size = 1.5\n", nil,
			[]string{`cohort.hcl:3,3-13: trainer.batch_size: an integer, got the number 1.5`}},
		{"a number for a string", "  name = 3\n", nil,
			[]string{`cohort.hcl:3,3-7: trainer.name: a string, got the number 3`}},
		{"a string for a bool", "  nesterov = \"yes\"\n", nil,
			[]string{`cohort.hcl:3,3-11: trainer.nesterov: true or false, got the string "yes"`}},
		{"a duration that does not parse", "  timeout = \"soon\"\n", nil,
			[]string{`cohort.hcl:3,3-10: trainer.timeout: "soon" is not a duration like "30s" or "1m30s"`}},
		{"a number for a duration", "  timeout = 30\n", nil,
			[]string{`cohort.hcl:3,3-10: trainer.timeout: a duration string like "30s", got the number 30`}},
		{"a list for an object", "  by_rank = [1]\n", nil,
			[]string{`cohort.hcl:3,3-10: trainer.by_rank: an object { key = value }, got a list`}},
		{"an object for a list", "  hidden = { a = 1 }\n", nil,
			[]string{`cohort.hcl:3,3-9: trainer.hidden: a list [ ... ], got an object`}},
		{"a long string is cut short", "  lr = \"" + strings.Repeat("x", 100) + "\"\n", nil,
			[]string{`trainer.lr: a number, got the string "` + strings.Repeat("x", 40) + `"...`}},
		{"a misspelled key gets a suggestion", "  nestrov = true\n", nil,
			[]string{`cohort.hcl:3,3-10: trainer.nestrov: unknown key; did you mean "nesterov"? trainer "mock" takes batch_size, by_rank, extra, future, hidden, lr, name, nesterov, timeout`}},
		{"a key like none gets none", "  optimizer = \"sgd\"\n", nil,
			[]string{`cohort.hcl:3,3-12: trainer.optimizer: unknown key; trainer "mock" takes batch_size,`}},
		{"an empty schema takes no settings", "  lr = 0.1\n", []plugin.SettingSpec{},
			[]string{`cohort.hcl:3,3-5: trainer.lr: unknown key; trainer "mock" takes no settings`}},
		{"a required key missing is reported on the block", "  lr = 0.1\n", []plugin.SettingSpec{
			{Key: "lr", Type: plugin.SettingNumber},
			{Key: "data", Type: plugin.SettingString, Required: true, Doc: "the data set's directory"},
		}, []string{`cohort.hcl:2,9-15: trainer.data: required by trainer "mock", and not set (the data set's directory)`}},
		{"a required key set to null is missing", "  data = null\n", []plugin.SettingSpec{
			{Key: "data", Type: plugin.SettingString, Required: true},
		}, []string{`cohort.hcl:2,9-15: trainer.data: required by trainer "mock", and not set`}},
		{"every problem, in the file's order", "  lr = \"fast\"\n  nestrov = true\n  batch_size = 1.5\n", nil, []string{
			`cohort.hcl:3,3-5: trainer.lr: a number`,
			`cohort.hcl:4,3-10: trainer.nestrov: unknown key`,
			`cohort.hcl:5,3-13: trainer.batch_size: an integer`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := "averager \"mock\" {}\ntrainer \"mock\" {\n" + tc.body + "}\n"
			c, err := Parse([]byte(src), "cohort.hcl")
			if err != nil {
				t.Fatal(err)
			}
			s := schema
			if tc.schema != nil {
				s = tc.schema
			}
			err = c.CheckPluginSettings(plugin.KindTrainer, s)
			checkErrors(t, err, tc.want)
			// The averager's block is its own (and empty): the trainer's
			// keys are not its.
			if err := c.CheckPluginSettings(plugin.KindAverager, []plugin.SettingSpec{}); err != nil {
				t.Errorf("averager: %v", err)
			}
			// A plugin that declares no schema is not checked.
			if err := c.CheckPluginSettings(plugin.KindTrainer, nil); err != nil {
				t.Errorf("no schema: %v", err)
			}
		})
	}
}

// checkErrors asserts err holds one *Error per want, in order, each
// starting with (or containing) its want.
func checkErrors(t *testing.T, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Errorf("error %v, want none", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("%v is not a *config.Error", err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("error %d:\n%s\nwant it to contain\n%s", i, lines[i], w)
		}
	}
}

// A plugin block the file leaves out (the built-in default's) has no line:
// its errors name the file; an unknown kind is an error, not a panic.
func TestCheckPluginSettingsWithoutLines(t *testing.T) {
	c, err := Parse([]byte("run {\n  ranks = 2\n}\n"), "cohort.hcl")
	if err != nil {
		t.Fatal(err)
	}
	err = c.CheckPluginSettings(plugin.KindAverager, []plugin.SettingSpec{{Key: "wire", Type: plugin.SettingString, Required: true}})
	checkErrors(t, err, []string{fmt.Sprintf(`cohort.hcl: averager.wire: required by averager %q, and not set`, blockLabel(t, "averager"))})
	if err := c.CheckPluginSettings("reducer", []plugin.SettingSpec{}); err == nil {
		t.Error("kind \"reducer\" accepted")
	}
}
