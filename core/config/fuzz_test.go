package config

import (
	"encoding/json"
	"testing"
)

// FuzzParse: no input panics Parse, and whatever it accepts is valid with
// settings that are JSON objects. Seeds: the default file, the full example
// and testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add(DefaultFile())
	f.Add([]byte(fullFile))
	f.Fuzz(func(t *testing.T, src []byte) {
		c, err := Parse(src, "fuzz.hcl")
		if err != nil {
			if c != nil || err.Error() == "" {
				t.Fatalf("error %q came with config %v", err, c)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v", err)
		}
		for _, p := range []Plugin{c.Trainer, c.Averager} {
			var obj map[string]any
			if err := json.Unmarshal(p.Settings, &obj); err != nil || obj == nil {
				t.Fatalf("%s settings are not a JSON object: %s", p.Name, p.Settings)
			}
		}
	})
}
