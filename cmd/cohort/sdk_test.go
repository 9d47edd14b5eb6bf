package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"

	"github.com/cohortdl/cohort/shared/plugin"
)

// sdkProxy writes a module proxy (GOPROXY=file://...) serving this
// checkout's SDK as plugin.SDKModule at version: what the tag
// shared/v<version> serves a vendor once made.
func sdkProxy(t *testing.T, version string) string {
	t.Helper()
	proxy := t.TempDir()
	mv := module.Version{Path: plugin.SDKModule, Version: version}
	at := filepath.Join(proxy, plugin.SDKModule, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := modzip.CreateFromDir(f, mv, "../../shared"); err != nil {
		t.Fatalf("zip the SDK module: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("../../shared/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		version + ".mod":  gomod,
		version + ".info": []byte(`{"Version":"` + version + `","Time":"` + time.Now().UTC().Format(time.RFC3339) + `"}`),
		"list":            []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return proxy
}

// goEnv is `go env name`.
func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// Every example is a vendor's module: its go.mod requires the SDK module
// at plugin.SDKVersion with no replace, and a copy of it outside this
// repository (no go.work) builds against the SDK served by a module proxy
// as its release tag serves it. The other modules come from this
// machine's module cache, then from the configured proxy.
func TestExamplesBuildAsVendorModules(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the examples")
	}
	mods, err := filepath.Glob("../../examples/*/go.mod")
	if err != nil || len(mods) < 2 {
		t.Fatalf("examples: %v, %v; want the averager and the trainer", mods, err)
	}
	version := "v" + plugin.SDKVersion
	proxy := sdkProxy(t, version)
	// One module cache for every example, removable (-modcacherw). With
	// -trimpath the compiled packages do not name where the cache is, so
	// the build cache serves them from one run to the next.
	modcache := t.TempDir()
	env := append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
		"GOMODCACHE="+modcache,
		"GONOSUMDB="+plugin.SDKModule,
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(goEnv(t, "GOMODCACHE"), "cache", "download")+","+goEnv(t, "GOPROXY"),
	)
	for _, gomod := range mods {
		dir := filepath.Dir(gomod)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			src, err := os.ReadFile(gomod)
			if err != nil {
				t.Fatal(err)
			}
			f, err := modfile.Parse(gomod, src, nil)
			if err != nil {
				t.Fatal(err)
			}
			required := ""
			for _, r := range f.Require {
				if r.Mod.Path == plugin.SDKModule {
					required = r.Mod.Version
				}
			}
			if required != version || len(f.Replace) > 0 {
				t.Fatalf("%s requires %s %q with %d replace directives; want %s and none, as a vendor's module has",
					gomod, plugin.SDKModule, required, len(f.Replace), version)
			}
			vendor := filepath.Join(t.TempDir(), filepath.Base(dir))
			if err := os.CopyFS(vendor, os.DirFS(dir)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			cmd := exec.Command("go", "build", "-o", filepath.Join(t.TempDir(), "plugin"), ".")
			cmd.Dir, cmd.Env = vendor, env
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build outside the repository: %v\n%s", err, out)
			}
			t.Logf("built outside the repository against %s@%s in %v", plugin.SDKModule, version, time.Since(start).Round(time.Millisecond))
		})
	}
}
