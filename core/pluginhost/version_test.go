package pluginhost_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// versionedBuild is the one build of testdata/versioned per test binary.
var versionedBuild struct {
	once sync.Once
	path string
	err  error
}

// versionedPlugin installs testdata/versioned as cohort-averaging-versioned
// in a fresh directory and returns the directory and the binary's path.
func versionedPlugin(t *testing.T) (dir, bin string) {
	t.Helper()
	versionedBuild.once.Do(func() {
		out, err := os.MkdirTemp("", "cohort-versioned-")
		if err != nil {
			versionedBuild.err = err
			return
		}
		versionedBuild.path = filepath.Join(out, "versioned")
		cmd := exec.Command("go", "build", "-buildvcs=false", "-o", versionedBuild.path, "./testdata/versioned")
		if b, err := cmd.CombinedOutput(); err != nil {
			versionedBuild.err = errors.New(err.Error() + "\n" + string(b))
		}
	})
	if versionedBuild.err != nil {
		t.Fatalf("build testdata/versioned: %v", versionedBuild.err)
	}
	src, err := os.ReadFile(versionedBuild.path)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	bin = filepath.Join(dir, pluginhost.BinaryName(pluginhost.Averager, "versioned"))
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

type nopRelay struct{}

func (nopRelay) Exchange(context.Context, string, []byte) (map[uint32][]byte, error) {
	return nil, nil
}

// A host speaks protocols 1 to 4: a plugin serving them all gets 4, one
// serving 1 to 3 gets 3, one
// serving 1 and 2 gets 2 and the relay, an old plugin serving only 1 still
// runs (without a relay), and a plugin from the future or the past is
// refused with both sides' versions.
func TestProtocolNegotiation(t *testing.T) {
	dir, _ := versionedPlugin(t)
	cases := []struct {
		name      string
		protocols string
		want      int    // negotiated version; 0: refused
		wantErr   string // for a refusal
	}{
		{"current", "", plugin.ProtocolVersion, ""},
		{"all", "1,2,3,4", 4, ""},
		{"load reason", "1,2,3", 3, ""},
		{"relay", "1,2", 2, ""},
		{"old plugin", "1", 1, ""},
		{"too new", "5", 0, "plugin cohort-averaging-versioned speaks cohort plugin protocol 5; this cohort speaks 1-4"},
		{"too old", "0", 0, "plugin cohort-averaging-versioned speaks cohort plugin protocol 0; this cohort speaks 1-4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A plugin refused at the handshake is killed before the host
			// learns its socket's path, so nobody can remove the socket: it
			// goes in the test's own temporary directory (under cohort
			// worker, in the worker's, which is removed when it ends).
			env := []string{"VERSIONED_PROTOCOLS=" + tc.protocols, "TMPDIR=" + t.TempDir()}
			h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, Env: env})
			ctx := context.Background()
			defer h.StopAll(ctx)
			a, p, err := h.StartAverager(ctx, "versioned")
			if tc.want == 0 {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, plugin.ErrProtocol) {
					t.Fatalf("StartAverager error %v, want one wrapping ErrProtocol with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Protocol(); got != tc.want {
				t.Errorf("negotiated protocol %d, want %d", got, tc.want)
			}
			traits, err := a.Configure(ctx, plugin.AveragerConfig{WorldSize: 1, Arena: arena.Descriptor{Path: "/nonexistent/arena"}, Settings: []byte("{}"), Relay: nopRelay{}})
			if err != nil {
				t.Fatalf("Configure: %v", err)
			}
			if gotRelay, wantRelay := traits.SoloIdentity, tc.want >= plugin.ProtocolRelay; gotRelay != wantRelay {
				t.Errorf("plugin got a relay: %v, want %v under protocol %d", gotRelay, wantRelay, tc.want)
			}
		})
	}
}

// The config's constraint on a plugin's own version refuses the plugin
// before anything but Describe is called.
func TestVersionConstraint(t *testing.T) {
	dir, _ := versionedPlugin(t)
	cases := []struct {
		version, constraint string
		wantErr             string
	}{
		{"1.3.0", ">= 1.2, < 2", ""},
		{"1.3.0", "", ""},
		{"1.1.0", ">= 1.2, < 2", `averager plugin "versioned" is version 1.1.0, which does not satisfy the config's constraint ">= 1.2, < 2"`},
		{"2.0.0", ">= 1.2, < 2", "is version 2.0.0"},
		{"latest", ">= 1.2", `reports version "latest"`},
	}
	for _, tc := range cases {
		t.Run(tc.version+" "+tc.constraint, func(t *testing.T) {
			h := pluginhost.New(pluginhost.Options{
				Dirs:     []string{dir},
				Env:      []string{"VERSIONED_VERSION=" + tc.version},
				Versions: map[pluginhost.Kind]string{pluginhost.Averager: tc.constraint},
			})
			defer h.StopAll(context.Background())
			_, p, err := h.StartAverager(context.Background(), "versioned")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("StartAverager error %v, want one containing %q", err, tc.wantErr)
			}
			if p != nil {
				t.Error("a refused plugin came back as a process")
			}
		})
	}
}

// A lock entry pins the binary: the accepted one runs, a swapped one is
// refused, even when the directory's SHA256SUMS was updated with it.
func TestLockRefusesSwappedBinary(t *testing.T) {
	dir, bin := versionedPlugin(t)
	src, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	lockPath := filepath.Join(t.TempDir(), pluginhost.DefaultLockFile)
	var lock pluginhost.Lock
	lock.Set(pluginhost.LockEntry{Kind: pluginhost.Averager, Name: "versioned", Version: "1.0.0", SHA256: hex.EncodeToString(sum[:])})
	if err := lock.Save(lockPath); err != nil {
		t.Fatal(err)
	}
	if err := pluginhost.AddSum(dir, filepath.Base(bin), sum[:]); err != nil {
		t.Fatal(err)
	}
	start := func() error {
		h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}, Lock: lockPath})
		defer h.StopAll(context.Background())
		_, _, err := h.StartAverager(context.Background(), "versioned")
		return err
	}
	if err := start(); err != nil {
		t.Fatalf("the locked binary: %v", err)
	}

	// Swap in another binary (the same program, a byte longer) and list
	// it in SHA256SUMS as an attacker with the directory would.
	swapped := append(bytes.Clone(src), 0)
	if err := os.WriteFile(bin, swapped, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, updateSums := range []bool{false, true} {
		if updateSums {
			s := sha256.Sum256(swapped)
			if err := pluginhost.AddSum(dir, filepath.Base(bin), s[:]); err != nil {
				t.Fatal(err)
			}
		}
		err := start()
		if err == nil || !strings.Contains(err.Error(), "plugin lock accepted "+hex.EncodeToString(sum[:])) {
			t.Errorf("SHA256SUMS updated %v: error %v, want a refusal naming the locked checksum", updateSums, err)
		}
	}
	// Without the lock the updated SHA256SUMS lets it run.
	h := pluginhost.New(pluginhost.Options{Dirs: []string{dir}})
	defer h.StopAll(context.Background())
	if _, _, err := h.StartAverager(context.Background(), "versioned"); err != nil {
		t.Errorf("unlocked: %v", err)
	}
}

func TestLoadLock(t *testing.T) {
	dir := t.TempDir()
	if l, err := pluginhost.LoadLock(filepath.Join(dir, "missing.json")); l != nil || err != nil {
		t.Errorf("missing lock = %v, %v; want nil, nil", l, err)
	}
	cases := []struct{ name, src, wantErr string }{
		{"not json", "{", "unexpected EOF"},
		{"unknown field", `{"lock_version":1,"plugns":[]}`, "unknown field"},
		{"future format", `{"lock_version":2,"plugins":[]}`, "lock_version 2"},
		{"bad sum", `{"lock_version":1,"plugins":[{"kind":"trainer","name":"t","version":"1","sha256":"abc"}]}`, `"abc" is not a SHA-256`},
		{"huge", `{"lock_version":1,"plugins":[` + strings.Repeat(" ", pluginhost.MaxLockSize) + `]}`, "over"},
	}
	for _, tc := range cases {
		p := filepath.Join(dir, tc.name+".json")
		if err := os.WriteFile(p, []byte(tc.src), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := pluginhost.LoadLock(p); err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v, want one naming %s and containing %q", tc.name, err, p, tc.wantErr)
		}
	}
}

// What a plugin says of itself must be what its lock entry accepted.
func TestLockCheckProbe(t *testing.T) {
	lock := &pluginhost.Lock{}
	lock.Set(pluginhost.LockEntry{Kind: pluginhost.Averager, Name: "median", Version: "1.2.0", Protocols: []int{2, 3}, SHA256: strings.Repeat("ab", 32)})
	probe := func(v string, proto int) pluginhost.Probe {
		return pluginhost.Probe{Description: plugin.Description{Version: v}, Protocol: proto}
	}
	for _, tc := range []struct {
		name    string
		lock    *pluginhost.Lock
		plugin  string
		probe   pluginhost.Probe
		wantErr string
	}{
		{"agrees", lock, "median", probe("1.2.0", 3), ""},
		{"same version spelt shorter", lock, "median", probe("1.2", 2), ""},
		{"another version", lock, "median", probe("1.1.9", 3), `averager plugin "median" describes itself as version "1.1.9", but the plugin lock accepted it as version 1.2.0`},
		{"a protocol the package did not list", lock, "median", probe("1.2.0", 1), `averager plugin "median" speaks plugin protocol 1, which its package did not list ([2 3])`},
		{"not locked", lock, "other", probe("9", 1), ""},
		{"no lock", nil, "median", probe("9", 1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.lock.CheckProbe(pluginhost.Averager, tc.plugin, tc.probe)
			if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
				t.Errorf("CheckProbe = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
