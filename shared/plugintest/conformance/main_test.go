package conformance_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The plugin binaries the tests run the suite on out of process.
var binaries = map[string]string{
	"cohort-trainer-mock":     "github.com/cohortdl/cohort/cmd/cohort-trainer-mock",
	"cohort-averaging-mock":   "github.com/cohortdl/cohort/cmd/cohort-averaging-mock",
	"cohort-averaging-median": "github.com/cohortdl/cohort/cmd/cohort/testdata/cohort-averaging-median",
}

var build struct {
	once sync.Once
	dir  string
	err  error
}

// binary builds every binary once per test binary (with -race when the
// tests run with it) and returns the path of name.
func binary(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "cohort-conformance-")
		if build.err != nil {
			return
		}
		args := []string{"build", "-buildvcs=false", "-o", build.dir + string(filepath.Separator)}
		if raceEnabled {
			args = append(args, "-race")
		}
		for _, pkg := range binaries {
			args = append(args, pkg)
		}
		cmd := exec.Command("go", args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			build.err = fmt.Errorf("%v: %w\n%s", cmd.Args, err, out.Bytes())
		}
	})
	if build.err != nil {
		t.Fatalf("build the plugins: %v", build.err)
	}
	return filepath.Join(build.dir, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	os.Exit(code)
}
