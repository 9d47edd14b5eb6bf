package python

import (
	"archive/zip"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The installable package holds exactly the sources launchers embed, and
// states the run-time needs.
func TestWheelHoldsTheSDK(t *testing.T) {
	out := t.TempDir()
	if b, err := exec.Command("./package.sh", out).CombinedOutput(); err != nil {
		t.Fatalf("package.sh: %v\n%s", err, b)
	}
	wheels, _ := filepath.Glob(filepath.Join(out, "cohort_plugin-*-py3-none-any.whl"))
	sdists, _ := filepath.Glob(filepath.Join(out, "cohort-plugin-*.tar.gz"))
	if len(wheels) != 1 || len(sdists) != 1 {
		t.Fatalf("built %v and %v, want one wheel and one sdist", wheels, sdists)
	}
	zr, err := zip.OpenReader(wheels[0])
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	inWheel := map[string]*zip.File{}
	var metadata string
	for _, f := range zr.File {
		inWheel[f.Name] = f
		if strings.HasSuffix(f.Name, ".dist-info/METADATA") {
			r, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(io.LimitReader(r, 1<<20))
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			metadata = string(b)
		}
	}
	err = fs.WalkDir(SDK, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, ok := inWheel[path]
		if !ok {
			t.Errorf("the wheel lacks %s", path)
			return nil
		}
		want, _ := fs.ReadFile(SDK, path)
		if f.UncompressedSize64 != uint64(len(want)) {
			t.Errorf("the wheel's %s is %d bytes, the source %d", path, f.UncompressedSize64, len(want))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// setuptools before 67 writes "torch (>=1.13)", later ones "torch>=1.13".
	for _, need := range []string{`Requires-Python: >=3\.9`, `Requires-Dist: grpcio \(?>=1\.51`, `Requires-Dist: protobuf \(?>=3\.20`, `Requires-Dist: torch \(?>=1\.13`} {
		if !regexp.MustCompile(`(?m)^` + strings.ReplaceAll(need, " ", " ?")).MatchString(metadata) {
			t.Errorf("the wheel's METADATA does not say %q:\n%s", need, metadata)
		}
	}
	if _, err := os.Stat("build"); err == nil {
		t.Errorf("building left shared/python/build in the checkout")
	}
}
