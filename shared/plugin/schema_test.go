package plugin

import (
	"encoding/json"
	"net"
	"reflect"
	"testing"
	"time"
)

type schemaEmbedded struct {
	Threads int `json:"threads" doc:"goroutines per rank"`
}

// SchemaOf reads each field's key from its json tag, its type from the Go
// type and the options and doc from its tags.
func TestSchemaOf(t *testing.T) {
	cases := []struct {
		name     string
		settings any
		want     []SettingSpec
	}{
		{"not a struct", 3, nil},
		{"nil", nil, nil},
		{"no fields: takes no settings", struct{}{}, []SettingSpec{}},
		{"scalars", &struct {
			Name  string  `json:"name" doc:"the model"`
			LR    float64 `json:"lr"`
			LR32  float32 `json:"lr32"`
			Batch uint32  `json:"batch_size" setting:"required"`
			Steps int64   `json:"steps"`
			On    bool    `json:"on"`
		}{}, []SettingSpec{
			{Key: "name", Type: SettingString, Doc: "the model"},
			{Key: "lr", Type: SettingNumber},
			{Key: "lr32", Type: SettingNumber},
			{Key: "batch_size", Type: SettingInteger, Required: true},
			{Key: "steps", Type: SettingInteger},
			{Key: "on", Type: SettingBool},
		}},
		{"pointers take their element's type", struct {
			LR   *float64 `json:"lr"`
			Nest **bool   `json:"nesterov"`
		}{}, []SettingSpec{{Key: "lr", Type: SettingNumber}, {Key: "nesterov", Type: SettingBool}}},
		{"durations", struct {
			Timeout string `json:"timeout" setting:"duration, required" doc:"read deadline"`
			// A time.Duration reads from JSON as nanoseconds.
			Nanos time.Duration `json:"nanos"`
		}{}, []SettingSpec{
			{Key: "timeout", Type: SettingDuration, Required: true, Doc: "read deadline"},
			{Key: "nanos", Type: SettingInteger},
		}},
		{"containers", struct {
			Hidden []int64            `json:"hidden"`
			Betas  [2]float64         `json:"betas"`
			ByRank map[string]string  `json:"by_rank"`
			Inner  struct{ A int }    `json:"inner"`
			Key    []byte             `json:"key"`
			Raw    json.RawMessage    `json:"raw"`
			Free   any                `json:"free"`
			IP     net.IP             `json:"ip"`
			Ptrs   []*schemaEmbedded  `json:"ptrs"`
			Maps   map[string][]int64 `json:"maps"`
		}{}, []SettingSpec{
			{Key: "hidden", Type: SettingArray},
			{Key: "betas", Type: SettingArray},
			{Key: "by_rank", Type: SettingObject},
			{Key: "inner", Type: SettingObject},
			{Key: "key", Type: SettingString},
			{Key: "raw", Type: SettingAny},
			{Key: "free", Type: SettingAny},
			{Key: "ip", Type: SettingString},
			{Key: "ptrs", Type: SettingArray},
			{Key: "maps", Type: SettingObject},
		}},
		{"json tags: skipped, untagged and embedded fields", struct {
			schemaEmbedded
			Skipped string `json:"-"`
			hidden  string //nolint:unused // unexported: not a setting
			Plain   string
			Omit    int `json:"omit,omitempty"`
		}{}, []SettingSpec{
			{Key: "threads", Type: SettingInteger, Doc: "goroutines per rank"},
			{Key: "Plain", Type: SettingString},
			{Key: "omit", Type: SettingInteger},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := SchemaOf(tc.settings)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("SchemaOf = %#v\nwant %#v", got, tc.want)
			}
			// The schema names exactly the keys DecodeSettings accepts.
			if tc.want != nil {
				keys := SettingKeys(tc.settings)
				if len(keys) != len(got) {
					t.Errorf("%d specs for %d keys %v", len(got), len(keys), keys)
				}
			}
		})
	}
}
