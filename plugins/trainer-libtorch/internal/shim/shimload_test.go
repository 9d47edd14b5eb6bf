//go:build cgo

package shim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeLib compiles a C file into a shared library.
func fakeLib(t *testing.T, name, src string) string {
	t.Helper()
	dir := t.TempDir()
	c := filepath.Join(dir, name+".c")
	so := filepath.Join(dir, name+".so")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", so, c).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, out)
	}
	return so
}

func TestShimLoadErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope", File)
	notELF := filepath.Join(t.TempDir(), "text.so")
	os.WriteFile(notELF, []byte("not a library"), 0o644)
	other := fakeLib(t, "other", "int something(void) { return 1; }\n")
	oldABI := fakeLib(t, "old", "unsigned cohort_torch_shim_abi_version(void) { return 999; }\nconst void *cohort_torch_shim_api(void) { return 0; }\n")

	_, err := openShim([]string{missing, notELF, other, oldABI})
	if err == nil {
		t.Fatal("loaded a shim from nothing")
	}
	msg := err.Error()
	for _, want := range []string{
		missing + " (no such file)",
		notELF + " (dlopen:",
		other + " (not a cohort libtorch shim",
		oldABI + fmt.Sprintf(" (shim ABI version 999, this plugin needs %d", ABI),
		Env,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}
	t.Log(msg)
}

func TestShimCandidates(t *testing.T) {
	t.Setenv(Env, "/opt/x/libcohort_torch_shim.so")
	if got := Candidates(); !slices.Equal(got, []string{"/opt/x/libcohort_torch_shim.so"}) {
		t.Fatalf("with %s set: %v", Env, got)
	}
	t.Setenv(Env, "")
	got := Candidates()
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	want := []string{filepath.Join(filepath.Dir(exe), File), filepath.Join("bin", "plugins", File)}
	if !slices.Equal(got, want) {
		t.Fatalf("candidates %v, want %v", got, want)
	}
}
