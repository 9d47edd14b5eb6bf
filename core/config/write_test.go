package config

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/cohortdl/cohort/shared/mtls"
)

// roundTrip writes c and parses the result.
func roundTrip(t *testing.T, c *Config) *Config {
	t.Helper()
	src, err := c.HCL()
	if err != nil {
		t.Fatalf("HCL: %v", err)
	}
	got, err := Parse(src, "written.hcl")
	if err != nil {
		t.Fatalf("parse the written config: %v\n%s", err, src)
	}
	return got
}

// Whatever a config holds, writing it and parsing the result gives it back:
// the launcher's workers read exactly the launcher's config.
func TestHCLRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *Config)
	}{
		{"default", func(*Config) {}},
		{"full file", func(c *Config) { *c = *mustParse(t, fullFile, "cohort.hcl") }},
		{"strings that need escapes", func(c *Config) {
			c.Run.Out = "runs/with \"quotes\" \\ and ${not a template} %{nor this}\n\ttabbed \x01 é"
			c.Coordinator.Listen = "[::1]:7000"
			c.Worker.PluginDir = "$HOME/plugins%"
		}},
		{"numbers at their edges", func(c *Config) {
			c.Run.Seed = math.MaxInt64
			c.Run.Ranks, c.Coordinator.MinRanks = 1000, 999
			c.Coordinator.Policy = PolicyCadence
			c.Coordinator.OverheadTarget = 0.1 + 0.2 // not the nearest float64 to 0.3
			c.Coordinator.EASGDAlpha = 1e-9
			c.Coordinator.ChunkBatches = 0
		}},
		{"negative seed, async", func(c *Config) {
			c.Run.Seed = -7
			c.Coordinator.Policy = PolicyAsync
			c.Coordinator.EASGDAlpha = 1
		}},
		{"eval role by number, never evaluated", func(c *Config) {
			c.Coordinator.EvalRank = "3"
			c.Coordinator.EvalEvery = 0
		}},
		{"durations", func(c *Config) {
			c.Coordinator.HeartbeatTimeout = 90 * time.Second
			c.Coordinator.FormationTimeout = time.Hour + 2*time.Minute + 3*time.Second
			c.Worker.LivenessTimeout = 1500 * time.Millisecond
			c.Worker.ConnectTimeout = 2*time.Second + 7*time.Nanosecond
			c.Worker.ShutdownGrace = 250 * time.Millisecond
		}},
		{"plugin settings of every JSON kind", func(c *Config) {
			// Settings as the decoder writes them: sorted keys, shortest numbers.
			c.Trainer = Plugin{Name: "mock", Settings: json.RawMessage(
				`{"big":12345678901234567,"by_rank":{"1":"12ms","odd key":{"n":-2.5}},"lr":0.001,"name":"a\"b\\c\n\t${x}","none":null,"tags":["x",null,true,[]]}`)}
			c.Averager = Plugin{Name: "cpu_2-b", Settings: json.RawMessage(`{}`)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := Default()
			tc.edit(want)
			want.Path = "written.hcl"
			checkSame(t, roundTrip(t, want), want)
		})
	}
}

// Every key of the decoder's table is written, in its block and order,
// sub-blocks included, so a key added to the table reaches the workers'
// config file.
func TestHCLWritesEveryKey(t *testing.T) {
	c := Default()
	dir := tlsDir(t)
	c.Coordinator.TLS, c.Worker.TLS = mtls.HostFiles(dir, "coord"), mtls.HostFiles(dir, "node")
	src, err := c.HCL()
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, "written.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	written := map[string][]string{}
	var walk func(path string, body *hclsyntax.Body)
	walk = func(path string, body *hclsyntax.Body) {
		for _, b := range body.Blocks {
			name := strings.TrimPrefix(path+"."+b.Type, ".")
			var names []string
			for _, a := range b.Body.Attributes {
				names = append(names, a.Name)
			}
			slices.SortFunc(names, func(x, y string) int {
				return b.Body.Attributes[x].SrcRange.Start.Byte - b.Body.Attributes[y].SrcRange.Start.Byte
			})
			written[name] = names
			walk(name, b.Body)
		}
	}
	walk("", f.Body.(*hclsyntax.Body))
	var check func(path string, b coreBlock)
	check = func(path string, b coreBlock) {
		var want []string
		for _, k := range b.keys {
			want = append(want, k.name)
		}
		if !slices.Equal(written[path], want) {
			t.Errorf("block %s: written %q, want %q", path, written[path], want)
		}
		for _, sb := range b.blocks {
			check(path+"."+sb.name, sb)
		}
	}
	for _, b := range coreKeys {
		check(b.name, b)
	}
	for _, kind := range []string{"trainer", "averager"} {
		if _, ok := written[kind]; !ok {
			t.Errorf("no %s block written", kind)
		}
	}
	// A side without TLS gets no tls block: the written file says no more
	// than the config does.
	if src, err := Default().HCL(); err != nil || strings.Contains(string(src), "tls") {
		t.Errorf("default config written with a tls block (error %v):\n%s", err, src)
	}
}

func TestHCLRefusesSettingsItCannotWrite(t *testing.T) {
	for _, tc := range []struct {
		settings string
		want     string
	}{
		{`{"not an identifier":1}`, `setting "not an identifier" is not an HCL attribute name`},
		{`[1,2]`, "not a JSON object"},
		{`{"a":`, "settings"},
	} {
		c := Default()
		c.Trainer.Settings = json.RawMessage(tc.settings)
		_, err := c.HCL()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `trainer "libtorch"`) {
			t.Errorf("settings %s: error %v, want one naming the trainer and %q", tc.settings, err, tc.want)
		}
	}
}
