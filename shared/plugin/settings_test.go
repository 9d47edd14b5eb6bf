package plugin

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

type testSettings struct {
	LR     *float64          `json:"lr"`
	Batch  uint32            `json:"batch_size"`
	Model  string            `json:"model,omitempty"`
	Hidden []int64           `json:"hidden"`
	Sleep  map[string]string `json:"sleep"`
	Inner  struct {
		Depth int `json:"depth"`
	} `json:"inner"`
	Skipped  int `json:"-"`
	internal int
}

func TestDecodeSettings(t *testing.T) {
	cases := []struct {
		name, in string
		want     func(s testSettings) bool // checked when err is ""
		err      string
	}{
		{name: "empty keeps the defaults", in: "", want: func(s testSettings) bool { return s.Batch == 64 && s.Model == "mlp" }},
		{name: "null keeps the defaults", in: " null\n", want: func(s testSettings) bool { return s.Batch == 64 }},
		{name: "empty object", in: "{}", want: func(s testSettings) bool { return s.Batch == 64 && s.LR == nil }},
		{name: "values", in: `{"lr": 0.5, "batch_size": 8, "hidden": [3, 4], "sleep": {"1": "2s"}, "inner": {"depth": 2}}`,
			want: func(s testSettings) bool {
				return *s.LR == 0.5 && s.Batch == 8 && slices.Equal(s.Hidden, []int64{3, 4}) && s.Sleep["1"] == "2s" && s.Inner.Depth == 2 && s.Model == "mlp"
			}},
		{name: "a null value keeps its default", in: `{"batch_size": null}`, want: func(s testSettings) bool { return s.Batch == 64 }},
		{name: "unknown key", in: `{"learning_rate": 1}`, err: `unknown key "learning_rate" (known keys: batch_size, hidden, inner, lr, model, sleep)`},
		{name: "keys are case-sensitive", in: `{"LR": 1}`, err: `unknown key "LR"`},
		{name: "untagged and unexported fields are not keys", in: `{"Skipped": 1}`, err: `unknown key "Skipped"`},
		{name: "duplicate key", in: `{"lr": 1, "lr": 2}`, err: `key "lr" appears twice`},
		{name: "trailing object", in: `{"lr": 0.1} {}`, err: "trailing data after the settings object"},
		{name: "trailing junk", in: `{"lr": 0.1} x`, err: "trailing data"},
		{name: "not an object", in: `[1]`, err: "the settings are a JSON array, want a JSON object"},
		{name: "a string", in: `"lr"`, err: "the settings are a JSON string"},
		{name: "truncated", in: `{"lr": 0.1`, err: "ends early"},
		{name: "bad syntax", in: `{"lr": 0.1,}`, err: "invalid JSON at byte"},
		{name: "negative into unsigned", in: `{"batch_size": -1}`, err: `key "batch_size": got a JSON number -1, want an integer, 0 or more, that fits uint32`},
		{name: "overflow", in: `{"batch_size": 4294967296}`, err: `key "batch_size": got a JSON number 4294967296`},
		{name: "string for a number", in: `{"lr": "0.1"}`, err: `key "lr": got a JSON string, want a number`},
		{name: "list element", in: `{"hidden": [1, "x"]}`, err: `key "hidden": got a JSON string, want an integer`},
		{name: "nested unknown key", in: `{"inner": {"width": 1}}`, err: `unknown field "width"`},
		{name: "nested type", in: `{"inner": {"depth": true}}`, err: `key "inner.depth": got a JSON bool`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := testSettings{Batch: 64, Model: "mlp"}
			err := DecodeSettings([]byte(tc.in), &s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(s) {
				t.Fatalf("decoded %+v", s)
			}
		})
	}
}

func TestDecodeSettingsTarget(t *testing.T) {
	var m map[string]any
	for _, v := range []any{nil, testSettings{}, &m, (*testSettings)(nil)} {
		if err := DecodeSettings([]byte(`{}`), v); err == nil || !strings.Contains(err.Error(), "want a non-nil pointer to a struct") {
			t.Errorf("%T: %v", v, err)
		}
	}
}

func TestSettingKeys(t *testing.T) {
	type embedded struct {
		Outer string `json:"outer"`
	}
	type withEmbedded struct {
		embedded
		Gamma float64 `json:"gamma,omitempty"`
		Plain int
	}
	if got, want := SettingKeys(&withEmbedded{}), []string{"Plain", "gamma", "outer"}; !slices.Equal(got, want) {
		t.Fatalf("keys %v, want %v", got, want)
	}
	if SettingKeys(3) != nil {
		t.Fatal("keys of a non-struct")
	}
}

// FuzzDecodeSettings: no input panics, and what decodes re-decodes from
// its own encoding to the same settings.
func FuzzDecodeSettings(f *testing.F) {
	for _, s := range []string{``, `null`, `{}`, `{"lr": 0.5, "hidden": [1]}`, `{"lr": 1, "lr": 2}`, `{"inner": {"depth": 3}}`, `{"x": 1} {}`, `[`, `{"batch_size": -1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s testSettings
		if err := DecodeSettings(b, &s); err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error message")
			}
			return
		}
		if s.Skipped != 0 || s.internal != 0 {
			t.Fatalf("%q set a field that is no key: %+v", b, s)
		}
		enc, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("%q decoded to %+v, which does not encode: %v", b, s, err)
		}
		var again testSettings
		if err := DecodeSettings(enc, &again); err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("%q decoded to %+v; its encoding %s to %+v (%v)", b, s, enc, again, err)
		}
	})
}
