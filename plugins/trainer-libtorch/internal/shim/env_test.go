//go:build cgo

package shim

import (
	"os"
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
