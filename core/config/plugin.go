package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/agext/levenshtein"

	"github.com/cohortdl/cohort/shared/plugin"
)

// CheckPluginSettings checks the settings of c's plugin block kind
// ("trainer" or "averager") against the schema its plugin declares in
// Describe, so that a mistake fails before any rank starts, naming the
// file, line and key: every key must be in the schema (an unknown one gets
// a did-you-mean when a known one is close), every value of the declared
// type (null leaves the plugin's default, as DecodeSettings does), and
// every required key set. A nil schema declares nothing and is not
// checked; an empty one refuses every key. It returns all the problems,
// each an *Error, like Validate.
func (c *Config) CheckPluginSettings(kind string, schema []plugin.SettingSpec) error {
	var p *Plugin
	switch kind {
	case plugin.KindTrainer:
		p = &c.Trainer
	case plugin.KindAverager:
		p = &c.Averager
	default:
		return fmt.Errorf("config: no plugin block of kind %q", kind)
	}
	if schema == nil {
		return nil
	}
	var errs errList
	block := fmt.Sprintf("%s %q", kind, p.Name)
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(p.Settings, &obj); err != nil {
		errs.add(c.at(kind), kind, "settings are not a JSON object") // as Validate says
		return errs.err()
	}
	specs := make(map[string]plugin.SettingSpec, len(schema))
	known := make([]string, 0, len(schema))
	for _, s := range schema {
		if _, dup := specs[s.Key]; !dup {
			specs[s.Key] = s
			known = append(known, s.Key)
		}
	}
	slices.Sort(known)
	for key, raw := range obj {
		name := kind + "." + key
		spec, ok := specs[key]
		if !ok {
			errs.add(c.at(name), name, unknownKey(key, block, known))
		} else if msg := checkSetting(spec.Type, raw); msg != "" {
			errs.add(c.at(name), name, msg)
		}
	}
	for _, key := range known {
		if spec := specs[key]; spec.Required && isNull(obj[key]) {
			msg := fmt.Sprintf("required by %s, and not set", block)
			if spec.Doc != "" {
				msg += " (" + spec.Doc + ")"
			}
			errs.add(c.at(kind), kind+"."+key, msg)
		}
	}
	return errs.err()
}

func isNull(raw json.RawMessage) bool {
	return raw == nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// checkSetting says what is wrong with raw as a value of type t; "" when
// nothing is. A type it does not know (from a newer plugin) takes anything.
func checkSetting(t plugin.SettingType, raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Sprintf("not a JSON value: %v", err)
	}
	ok := true
	switch t {
	case plugin.SettingString:
		_, ok = v.(string)
	case plugin.SettingNumber:
		_, ok = v.(json.Number)
	case plugin.SettingInteger:
		n, isNum := v.(json.Number)
		if ok = isNum; ok {
			f, _, err := big.ParseFloat(n.String(), 10, 64, big.ToNearestEven)
			ok = err == nil && f.IsInt()
		}
	case plugin.SettingBool:
		_, ok = v.(bool)
	case plugin.SettingDuration:
		s, isStr := v.(string)
		if !isStr {
			ok = false
			break
		}
		if _, err := time.ParseDuration(s); err != nil {
			return fmt.Sprintf("%s is not a duration like \"30s\" or \"1m30s\"", quote(s))
		}
	case plugin.SettingObject:
		_, ok = v.(map[string]any)
	case plugin.SettingArray:
		_, ok = v.([]any)
	}
	if ok {
		return ""
	}
	return fmt.Sprintf("%s, got %s", typeName(t), valueName(v))
}

// typeName is what a setting of type t takes, in words.
func typeName(t plugin.SettingType) string {
	switch t {
	case plugin.SettingString:
		return "a string"
	case plugin.SettingNumber:
		return "a number"
	case plugin.SettingInteger:
		return "an integer"
	case plugin.SettingBool:
		return "true or false"
	case plugin.SettingDuration:
		return "a duration string like \"30s\""
	case plugin.SettingObject:
		return "an object { key = value }"
	case plugin.SettingArray:
		return "a list [ ... ]"
	}
	return string(t)
}

// valueName names a decoded JSON value for an error message.
func valueName(v any) string {
	switch v := v.(type) {
	case string:
		return "the string " + quote(v)
	case json.Number:
		return "the number " + v.String()
	case bool:
		return fmt.Sprint(v)
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%v", v)
}

// quote quotes s, cut short: a message names a value, it need not repeat
// a long one.
func quote(s string) string {
	const max = 40
	if r := []rune(s); len(r) > max {
		return fmt.Sprintf("%q...", string(r[:max]))
	}
	return fmt.Sprintf("%q", s)
}

// unknownKey is the message for an unknown key name of block (as errors
// name it), which takes the known keys: it suggests the closest known
// key, as HCL does for its own schemas (an edit distance under 3).
func unknownKey(name, block string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		// "tls { }" suggests as "tls", except for tls itself: a block
		// written as a key is told what the block takes.
		k, _, _ = strings.Cut(k, " ")
		if d := levenshtein.Distance(name, k, nil); d > 0 && d < bestDist {
			best, bestDist = k, d
		}
	}
	msg := "unknown key; "
	if best != "" {
		msg += fmt.Sprintf("did you mean %q? ", best)
	}
	if len(known) == 0 {
		return msg + block + " takes no settings"
	}
	return msg + block + " takes " + strings.Join(known, ", ")
}
