package plugin

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// A plugin's line, as go-plugin re-logs it, carries the host's short name
// once and neither the plugin's timestamp nor its logger name.
func TestReloggerKeepsTheHostsName(t *testing.T) {
	cases := []struct {
		name string
		args []any
		want string
	}{
		{"plugin keys dropped", []any{"k", 1, "@module", "cohort-trainer-x.trainer", "timestamp", "2026-01-01T00:00:00.000Z"}, "rank 2 trainer: ready: k=1\n"},
		{"nothing to drop", []any{"a", "b"}, "rank 2 trainer: ready: a=b\n"},
		{"odd args kept", []any{"a", "b", "timestamp"}, "rank 2 trainer: ready: a=b EXTRA_VALUE_AT_END=timestamp\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			host := hclog.New(&hclog.LoggerOptions{Name: "rank 2 trainer", Output: &b, DisableTime: true})
			// go-plugin names the stderr logger after the binary.
			newRelogger(host).Named("cohort-trainer-x").Info("ready", tc.args...)
			got := strings.TrimPrefix(b.String(), "[INFO]  ")
			if got != tc.want {
				t.Errorf("logged %q, want %q", got, tc.want)
			}
		})
	}
}
