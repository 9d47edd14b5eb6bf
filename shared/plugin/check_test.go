package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// checkingTrainer is a fakeTrainer that checks its settings.
type checkingTrainer struct {
	fakeTrainer
	got json.RawMessage
}

func (c *checkingTrainer) CheckSettings(_ context.Context, settings json.RawMessage) ([]SettingProblem, error) {
	c.got = settings
	return []SettingProblem{{Key: "lr", Message: "lr = -5, want above 0"}, {Message: "the block as a whole"}}, nil
}

// checkingAverager is a fakeAverager whose check fails outright.
type checkingAverager struct{ fakeAverager }

func (*checkingAverager) CheckSettings(context.Context, json.RawMessage) ([]SettingProblem, error) {
	return nil, errors.New("cannot check")
}

// CheckSettings crosses the protocol both ways: the plugin's problems
// arrive whole, its error as an error; a plugin without the method (built
// before it) answers UNIMPLEMENTED, which the host takes as "nothing
// checked", not as a failure.
func TestCheckSettingsNegotiated(t *testing.T) {
	ctx := context.Background()
	impl := &checkingTrainer{}
	tr := serveTrainer(t, impl)
	problems, err := tr.(SettingsChecker).CheckSettings(ctx, json.RawMessage(`{"lr":-5}`))
	want := []SettingProblem{{Key: "lr", Message: "lr = -5, want above 0"}, {Message: "the block as a whole"}}
	if err != nil || !reflect.DeepEqual(problems, want) || string(impl.got) != `{"lr":-5}` {
		t.Errorf("checking trainer: %+v, %v (it got %s)", problems, err, impl.got)
	}
	old := serveTrainer(t, &fakeTrainer{})
	if problems, err := old.(SettingsChecker).CheckSettings(ctx, json.RawMessage(`{}`)); err != nil || problems != nil {
		t.Errorf("a trainer without CheckSettings: %+v, %v; want nothing checked and no error", problems, err)
	}
	av := serveAverager(t, &checkingAverager{})
	if _, err := av.(SettingsChecker).CheckSettings(ctx, json.RawMessage(`{}`)); err == nil {
		t.Error("an averager whose check failed: no error")
	}
	oldAv := serveAverager(t, &fakeAverager{})
	if problems, err := oldAv.(SettingsChecker).CheckSettings(ctx, json.RawMessage(`{}`)); err != nil || problems != nil {
		t.Errorf("an averager without CheckSettings: %+v, %v", problems, err)
	}
}

// ProblemOf finds the key a refusal starts with, past its prefix, only
// among the schema's keys.
func TestProblemOf(t *testing.T) {
	schema := []SettingSpec{{Key: "lr"}, {Key: "lr_min"}, {Key: "wire"}}
	for _, tc := range []struct {
		err  string
		want SettingProblem
	}{
		{`averager settings: wire = "fp8": want "f32" or "bf16"`, SettingProblem{Key: "wire", Message: `wire = "fp8": want "f32" or "bf16"`}},
		{"libtorch trainer settings: lr_min = 2, want 0 <= lr_min <= lr (1)", SettingProblem{Key: "lr_min", Message: "lr_min = 2, want 0 <= lr_min <= lr (1)"}},
		{"lr: not a number", SettingProblem{Key: "lr", Message: "lr: not a number"}},
		{"set either data or data_x, not both", SettingProblem{Message: "set either data or data_x, not both"}},
		{"lrx = 1", SettingProblem{Message: "lrx = 1"}},
	} {
		if got := ProblemOf(errors.New(tc.err), schema); got != tc.want {
			t.Errorf("ProblemOf(%q) = %+v, want %+v", tc.err, got, tc.want)
		}
	}
}
