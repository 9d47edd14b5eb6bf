package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

// cohort's version comes from its build: a released module's version, or
// the one make stamps, then the commit go recorded.
func TestBuildVersion(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "904f8bdc88d76b312aa395ee2688830cd8b220ee"},
		{Key: "vcs.time", Value: "2026-12-02T11:19:00Z"}, {Key: "vcs.modified", Value: "true"}}
	cases := []struct {
		name    string
		stamped string
		bi      *debug.BuildInfo
		want    string
	}{
		{"no build information", "", nil, "devel"},
		{"a local build", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"stamped by make", "v0.3.0-4-g904f8bd", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "v0.3.0-4-g904f8bd"},
		{"go install of a release", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"}}, "v1.2.0"},
		{"with VCS information", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			"devel (commit 904f8bdc88d7, 2026-12-02T11:19:00Z, modified)"},
	}
	defer func(v string) { version = v }(version)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			version = tc.stamped
			if got := buildVersion(tc.bi, tc.bi != nil); got != tc.want {
				t.Errorf("version %q, want %q", got, tc.want)
			}
		})
	}
}

// `cohort completion SHELL` writes a completion script that knows the
// commands.
func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{"completion", shell})
		if err := root.Execute(); err != nil {
			t.Fatalf("completion %s: %v", shell, err)
		}
		if !strings.Contains(out.String(), "cohort") || out.Len() < 1000 {
			t.Errorf("completion %s: %d bytes: %.200s", shell, out.Len(), out.String())
		}
	}
	// The script asks cohort itself, which completes commands by prefix.
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"__complete", "va"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "validate\t") {
		t.Errorf("completing \"va\": %q, want validate", out.String())
	}
}
