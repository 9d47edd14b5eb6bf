package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
)

// DecodeSettings decodes a plugin's config block (TrainerConfig.Settings or
// AveragerConfig.Settings: the block of the run's config, as JSON) into v,
// a pointer to the plugin's settings struct holding its defaults. Empty
// input or null leaves v as it is, as does a key set to null. It is strict,
// so that a typo in a config file fails the run instead of training with a
// default:
//
//   - the top level must be one JSON object, with nothing after it;
//   - every key must be one of v's JSON keys, spelled exactly (encoding/json
//     alone would take "LR" for "lr"), and appear once;
//   - every value must fit its field.
//
// Errors name the key and what was wrong with it; an unknown key's error
// lists the known ones. Each plugin checks the values and fills in derived
// defaults afterwards.
func DecodeSettings(raw []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("plugin.DecodeSettings: want a non-nil pointer to a struct, got %T", v)
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return nil
	}
	known := SettingKeys(v)
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("the settings are %s, want a JSON object", jsonKind(tok))
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(err)
		}
		key, ok := tok.(string)
		if !ok { // json.Decoder refuses a non-string key itself; kept for safety
			return fmt.Errorf("a key of the settings object is %v, want a string", tok)
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return fmt.Errorf("key %q: %w", key, syntaxError(err))
		}
		switch {
		case !slices.Contains(known, key):
			return fmt.Errorf("unknown key %q (known keys: %s)", key, strings.Join(known, ", "))
		case seen[key]:
			return fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return syntaxError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the settings object")
	}

	// The keys are known and unique: decode the values. Nested objects are
	// held to their fields too.
	vdec := json.NewDecoder(bytes.NewReader(trimmed))
	vdec.DisallowUnknownFields()
	if err := vdec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return fmt.Errorf("key %q: got a JSON %s, want %s", typeErr.Field, typeErr.Value, describe(typeErr.Type))
		}
		return err
	}
	return nil
}

// SettingKeys lists the JSON keys of the struct v (or *v) points to,
// sorted: what DecodeSettings accepts, for error messages and for tests
// that check a plugin's README documents every key.
func SettingKeys(v any) []string {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	keys := structKeys(t, nil)
	slices.Sort(keys)
	return keys
}

// structKeys appends t's JSON keys to keys, those of untagged embedded
// structs included, as encoding/json promotes them.
func structKeys(t reflect.Type, keys []string) []string {
	walkFields(t, func(name string, _ reflect.StructField) { keys = append(keys, name) })
	return keys
}

// walkFields calls fn with each JSON key of struct type t and its field,
// in field order, descending into untagged embedded structs as
// encoding/json promotes their fields.
func walkFields(t reflect.Type, fn func(name string, f reflect.StructField)) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-":
			continue
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
			walkFields(f.Type, fn)
			continue
		case !f.IsExported():
			continue
		case name == "":
			name = f.Name
		}
		fn(name, f)
	}
}

func syntaxError(err error) error {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON at byte %d: %w", se.Offset, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the settings JSON ends early")
	}
	return err
}

// jsonKind names a top-level token's kind for an error message.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		return "a JSON array"
	case string:
		return "a JSON string"
	case json.Number:
		return "a JSON number"
	case bool:
		return "a JSON boolean"
	}
	return fmt.Sprintf("%v", tok)
}

// describe says in JSON terms what a Go type takes.
func describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer that fits %s", t)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return fmt.Sprintf("an integer, 0 or more, that fits %s", t)
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list, each " + describe(t.Elem())
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}
