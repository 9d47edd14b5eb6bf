package main

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// version is what the build says cohort is when the module and VCS
// information cannot: `make build` sets it to `git describe`'s answer with
// -ldflags "-X main.version=..." (go's own VCS stamping may be off, as
// with GOFLAGS=-buildvcs=false).
var version = ""

// buildVersion is cohort's version as its build recorded it: the module's
// version when it was built as a released module (`go install
// github.com/cohortdl/cohort/cmd/cohort@v1.2.0`), else the -ldflags
// version, else "devel"; then the commit, its time and "modified" for a
// tree with changes, where go stamped them.
func buildVersion(bi *debug.BuildInfo, ok bool) string {
	v := version
	var vcs []string
	if ok {
		if mv := bi.Main.Version; mv != "" && mv != "(devel)" {
			v = mv
		}
		setting := map[string]string{}
		for _, s := range bi.Settings {
			setting[s.Key] = s.Value
		}
		if rev := setting["vcs.revision"]; rev != "" {
			vcs = append(vcs, "commit "+rev[:min(len(rev), 12)])
		}
		if t := setting["vcs.time"]; t != "" {
			vcs = append(vcs, t)
		}
		if setting["vcs.modified"] == "true" {
			vcs = append(vcs, "modified")
		}
	}
	if v == "" {
		v = "devel"
	}
	if len(vcs) > 0 {
		v += " (" + strings.Join(vcs, ", ") + ")"
	}
	return v
}

// cohortVersion is this binary's buildVersion.
func cohortVersion() string {
	bi, ok := debug.ReadBuildInfo()
	return buildVersion(bi, ok)
}

// versionText is what `cohort version` prints.
func versionText(protocols, sdk string) string {
	return fmt.Sprintf("cohort %s\nplugin protocols %s\nplugin SDK %s\n", cohortVersion(), protocols, sdk)
}
