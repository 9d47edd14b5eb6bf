package plugin

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
)

// SettingType is the kind of value a setting takes, in the terms of the
// JSON the plugin receives.
type SettingType string

// The setting types.
const (
	SettingString  SettingType = "string"
	SettingNumber  SettingType = "number"
	SettingInteger SettingType = "integer" // a number with no fractional part
	SettingBool    SettingType = "bool"
	// SettingDuration is a string time.ParseDuration accepts ("30s").
	SettingDuration SettingType = "duration"
	SettingObject   SettingType = "object"
	SettingArray    SettingType = "array"
	SettingAny      SettingType = "any"
)

// SettingTypes lists every SettingType.
var SettingTypes = []SettingType{SettingString, SettingNumber, SettingInteger, SettingBool,
	SettingDuration, SettingObject, SettingArray, SettingAny}

// SettingSpec declares one key of a plugin's config block.
type SettingSpec struct {
	Key  string
	Type SettingType
	// Required keys must be set (not null); the others have defaults.
	Required bool
	// Doc is a one-line description.
	Doc string
}

// SchemaOf derives the settings schema of a settings struct (or a pointer
// to one) from its fields, the keys DecodeSettings accepts, in field
// order: the key is the json tag's name, the type follows the Go type
// (integers are integer, floats number, slices array, maps and structs
// object, interfaces and json.Unmarshalers any, encoding.TextUnmarshalers
// string), and the doc is the `doc:"..."` tag. A `setting:"..."` tag
// adds comma-separated options: "required", and "duration" for a string
// holding a Go duration. A non-struct gives nil (no schema declared).
func SchemaOf(settings any) []SettingSpec {
	t := reflect.TypeOf(settings)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	specs := []SettingSpec{}
	walkFields(t, func(name string, f reflect.StructField) {
		spec := SettingSpec{Key: name, Type: settingType(f.Type), Doc: f.Tag.Get("doc")}
		for _, opt := range strings.Split(f.Tag.Get("setting"), ",") {
			switch strings.TrimSpace(opt) {
			case "required":
				spec.Required = true
			case "duration":
				spec.Type = SettingDuration
			}
		}
		specs = append(specs, spec)
	})
	return specs
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// settingType is the JSON value encoding/json decodes into a t.
func settingType(t reflect.Type) SettingType {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pt := reflect.PointerTo(t)
	switch {
	case pt.Implements(jsonUnmarshaler):
		return SettingAny
	case pt.Implements(textUnmarshaler):
		return SettingString
	}
	switch t.Kind() {
	case reflect.String:
		return SettingString
	case reflect.Bool:
		return SettingBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return SettingInteger
	case reflect.Float32, reflect.Float64:
		return SettingNumber
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 { // encoding/json reads []byte from base64
			return SettingString
		}
		return SettingArray
	case reflect.Array:
		return SettingArray
	case reflect.Map, reflect.Struct:
		return SettingObject
	}
	return SettingAny
}
