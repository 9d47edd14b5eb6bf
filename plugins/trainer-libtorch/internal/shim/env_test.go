//go:build cgo

package shim

import (
	"os"
	"slices"
	"testing"
)

// The threading settings the plugin gives libgomp and OpenBLAS before they
// load: its own where the environment has none, the environment's where it
// chose.
func TestThreadingEnvironment(t *testing.T) {
	for _, tc := range []struct {
		key, preset, want string
		set               func()
	}{
		{"OMP_WAIT_POLICY", "", "PASSIVE", passiveOpenMP},
		{"OMP_WAIT_POLICY", "ACTIVE", "ACTIVE", passiveOpenMP},
		{"OPENBLAS_THREAD_TIMEOUT", "", OpenBLASThreadTimeout, briefOpenBLASSpin},
		{"OPENBLAS_THREAD_TIMEOUT", "28", "28", briefOpenBLASSpin},
	} {
		t.Setenv(tc.key, tc.preset) // restores the variable after the test
		if tc.preset == "" {
			os.Unsetenv(tc.key)
		}
		tc.set()
		if got := os.Getenv(tc.key); got != tc.want {
			t.Errorf("%s preset %q: %q after, want %q", tc.key, tc.preset, got, tc.want)
		}
	}
}

// A user's own glibc malloc settings keep the plugin's away; anything else
// in the environment does not.
func TestMallocChosen(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want bool
	}{
		{nil, false},
		{[]string{"PATH=/usr/bin", "MALLOC_ARENA_MAX=2", "OMP_NUM_THREADS=4"}, false},
		{[]string{"MALLOC_TRIM_THRESHOLD_=0"}, true},
		{[]string{"MALLOC_MMAP_THRESHOLD_=131072"}, true},
		{[]string{"MALLOC_TOP_PAD_=0"}, true},
		{[]string{"MALLOC_MMAP_MAX_=0"}, true},
		{[]string{"GLIBC_TUNABLES=glibc.malloc.arena_max=2"}, false},
		{[]string{"GLIBC_TUNABLES=glibc.pthread.rseq=0:glibc.malloc.trim_threshold=1048576"}, true},
		{[]string{"GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536"}, true},
		{[]string{"XMALLOC_TRIM_THRESHOLD_=1"}, false},
	} {
		if got := mallocChosen(tc.env); got != tc.want {
			t.Errorf("mallocChosen(%q) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

// MallocEnv hands another process the plugin's settings, or nothing where
// the environment chose its own.
func TestMallocEnv(t *testing.T) {
	want := []string{"MALLOC_MMAP_THRESHOLD_=33554432", "MALLOC_TRIM_THRESHOLD_=67108864"}
	if got := MallocEnv([]string{"PATH=/usr/bin"}); !slices.Equal(got, want) {
		t.Errorf("MallocEnv without a choice = %q, want %q", got, want)
	}
	if got := MallocEnv([]string{"MALLOC_TOP_PAD_=0"}); got != nil {
		t.Errorf("MallocEnv with MALLOC_TOP_PAD_ set = %q, want nothing", got)
	}
}
