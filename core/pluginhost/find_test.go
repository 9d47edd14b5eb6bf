package pluginhost_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/pluginhost"
)

func writeExe(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func sumLine(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return fmt.Sprintf("%s  %s\n", hex.EncodeToString(s[:]), filepath.Base(path))
}

func TestFindOrder(t *testing.T) {
	first, second, third, onPath := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	writeExe(t, second, "cohort-averaging-fabric", "#!/bin/sh\n")
	writeExe(t, onPath, "cohort-averaging-fabric", "#!/bin/sh\n")
	writeExe(t, onPath, "cohort-trainer-mock", "#!/bin/sh\n")
	// Not executable: skipped.
	os.WriteFile(filepath.Join(first, "cohort-averaging-fabric"), []byte("x"), 0o644)
	// Installed once, then broken: a file that lost its mode, and a file
	// its directory's SHA256SUMS still lists.
	os.WriteFile(filepath.Join(first, "cohort-trainer-plain"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(third, pluginhost.SumsFile), []byte(strings.Repeat("ab", 32)+"  cohort-averaging-gone\n"), 0o644)
	t.Setenv("PATH", onPath)

	cases := []struct {
		kind    pluginhost.Kind
		name    string
		wantDir string
		wantErr string
	}{
		{pluginhost.Averager, "fabric", second, ""},
		{pluginhost.Trainer, "mock", onPath, ""},
		{pluginhost.Trainer, "nope", "", "no executable cohort-trainer-nope"},
		{pluginhost.Trainer, "plain", "", "its executable is missing: " + filepath.Join(first, "cohort-trainer-plain") + " is not executable (mode -rw-r--r--)"},
		{pluginhost.Averager, "gone", "", "its executable is missing: " + filepath.Join(third, pluginhost.SumsFile) + " lists cohort-averaging-gone, but the file is missing"},
		{pluginhost.Averager, "../x", "", "invalid name"},
		{pluginhost.Averager, "", "", "invalid name"},
	}
	for _, c := range cases {
		t.Run(string(c.kind)+"/"+c.name, func(t *testing.T) {
			loc, err := pluginhost.Find([]string{first, second, third}, c.kind, c.name)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Find = %+v, %v; want error containing %q", loc, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Dir(loc.Path) != c.wantDir {
				t.Fatalf("found %s, want it in %s", loc.Path, c.wantDir)
			}
			if loc.Checksum != nil {
				t.Fatalf("checksum %x without a SHA256SUMS file", loc.Checksum)
			}
		})
	}
}

func TestFindReadsSHA256SUMS(t *testing.T) {
	dir := t.TempDir()
	cpu := writeExe(t, dir, "cohort-averaging-fabric", "#!/bin/sh\necho cpu\n")
	mock := writeExe(t, dir, "cohort-trainer-mock", "#!/bin/sh\necho mock\n")
	os.WriteFile(filepath.Join(dir, pluginhost.SumsFile), []byte("# plugins\n"+sumLine(t, cpu)), 0o644)

	loc, err := pluginhost.Find([]string{dir}, pluginhost.Averager, "fabric")
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte("#!/bin/sh\necho cpu\n"))
	if string(loc.Checksum) != string(want[:]) {
		t.Fatalf("checksum %x, want %x", loc.Checksum, want)
	}
	if _, err := pluginhost.Find([]string{dir}, pluginhost.Trainer, "mock"); err == nil || !strings.Contains(err.Error(), "does not list cohort-trainer-mock") {
		t.Fatalf("unlisted plugin: %v", err)
	}
	_ = mock

	os.WriteFile(filepath.Join(dir, pluginhost.SumsFile), []byte("zz  cohort-averaging-fabric\n"), 0o644)
	if _, err := pluginhost.Find([]string{dir}, pluginhost.Averager, "fabric"); err == nil || !strings.Contains(err.Error(), "not a SHA-256") {
		t.Fatalf("malformed sums: %v", err)
	}
}

func TestStartRefusesTamperedBinary(t *testing.T) {
	dir := t.TempDir()
	cpu := writeExe(t, dir, "cohort-averaging-fabric", "#!/bin/sh\nexit 0\n")
	os.WriteFile(filepath.Join(dir, pluginhost.SumsFile), []byte(sumLine(t, cpu)), 0o644)
	// The binary changes after its checksum was published.
	writeExe(t, dir, "cohort-averaging-fabric", "#!/bin/sh\necho evil\n")

	h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}})
	_, _, err := h.StartAverager(context.Background(), "fabric")
	if err == nil || !strings.Contains(err.Error(), "does not match its SHA256SUMS entry") {
		t.Fatalf("StartAverager of a tampered binary = %v", err)
	}
}

func TestList(t *testing.T) {
	first, second := t.TempDir(), t.TempDir()
	t.Setenv("PATH", "")
	writeExe(t, first, "cohort-averaging-fabric", "#!/bin/sh\n")
	good := writeExe(t, first, "cohort-trainer-mock", "#!/bin/sh\necho good\n")
	tampered := writeExe(t, first, "cohort-trainer-libtorch", "#!/bin/sh\necho v1\n")
	os.WriteFile(filepath.Join(first, pluginhost.SumsFile), []byte(sumLine(t, good)+sumLine(t, tampered)), 0o644)
	writeExe(t, first, "cohort-trainer-libtorch", "#!/bin/sh\necho v2\n")
	// Shadowed by the first directory's copy, as Find would pick.
	writeExe(t, second, "cohort-trainer-mock", "#!/bin/sh\n")
	writeExe(t, second, "cohort-averaging-nccl", "#!/bin/sh\n")
	// Not plugins: a data file, a bare prefix, something else.
	os.WriteFile(filepath.Join(second, "cohort-averaging-data"), []byte("x"), 0o644)
	writeExe(t, second, "cohort-trainer-", "#!/bin/sh\n")
	writeExe(t, second, "cohort", "#!/bin/sh\n")

	type row struct {
		kind  pluginhost.Kind
		name  string
		dir   string
		state string
	}
	var got []row
	for _, l := range pluginhost.List([]string{first, second}) {
		state := "ok"
		switch {
		case l.Err != nil && strings.Contains(l.Err.Error(), "does not list"):
			state = "unlisted"
		case l.Err != nil && strings.Contains(l.Err.Error(), "does not match"):
			state = "tampered"
		case l.Err != nil:
			state = l.Err.Error()
		case l.Checksum != nil:
			state = "verified"
		}
		got = append(got, row{l.Kind, l.Name, filepath.Dir(l.Path), state})
	}
	want := []row{
		{pluginhost.Averager, "fabric", first, "unlisted"},
		{pluginhost.Trainer, "libtorch", first, "tampered"},
		{pluginhost.Trainer, "mock", first, "verified"},
		{pluginhost.Averager, "nccl", second, "ok"},
	}
	if len(got) != len(want) {
		t.Fatalf("List = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A binary that is not a cohort plugin fails to start within seconds, and
// the error quotes what it wrote to stderr: what it prints instead of the
// handshake, what it says before exiting, or (silent) the start timeout.
func TestStartShowsABrokenPluginsStderr(t *testing.T) {
	cases := []struct {
		name, script string
		want         []string
	}{
		{"garbage", "#!/bin/sh\necho 'libfoo.so: cannot open shared object' >&2\necho 'hello world'\nexec sleep 30\n",
			[]string{"hello world", "its stderr:\nlibfoo.so: cannot open shared object"}},
		{"exits", "#!/bin/sh\necho 'config missing' >&2\nexit 3\n", []string{"its stderr:\nconfig missing"}},
		{"silent", "#!/bin/sh\necho 'waiting forever' >&2\nexec sleep 30\n", []string{"timeout", "its stderr:\nwaiting forever"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeExe(t, dir, "cohort-trainer-broken", tc.script)
			h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, StartTimeout: time.Second})
			start := time.Now()
			_, _, err := h.StartTrainer(context.Background(), "broken")
			if err == nil {
				t.Fatal("a broken plugin started")
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("failed after %v, want within seconds", took)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
