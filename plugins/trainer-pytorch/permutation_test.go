package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cohortdl/cohort/plugins/trainer-pytorch/internal/launch"
	"github.com/cohortdl/cohort/shared/plugin"
)

// runPython runs script on the interpreter the launcher would pick, with the checkout's
// SDK on its path.
func runPython(t *testing.T, script string, args ...string) []byte {
	t.Helper()
	in, err := launch.Find(context.Background(), os.Getenv(launch.PythonEnv), os.Getenv("PATH"))
	if err != nil {
		t.Fatalf("the tests need the Python the plugin needs (make deps installs it): %v", err)
	}
	sdk, err := filepath.Abs("../../shared/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(in.Path, append([]string{"-c", script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("%s: %v\n%s", in.Path, err, ee.Stderr)
		}
		t.Fatalf("%s: %v", in.Path, err)
	}
	return out
}

// permDigest is the SHA-256 of a permutation as little-endian uint64s.
func permDigest(p []uint64) string {
	h := sha256.New()
	var b [8]byte
	for _, v := range p {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Python's permutation is Go's, bit for bit: seeds and epochs across the
// 64-bit range, pick spaces of one, powers of two (Uint64N's mask path)
// and others (its rejection path), up to a data set's size.
func TestPermutationMatchesGo(t *testing.T) {
	seeds := []uint64{0, 1, 7, 1 << 63, 0xfedcba9876543210}
	epochs := []uint64{0, 1, 2, 39, 1 << 40}
	spaces := []uint64{1, 2, 3, 10, 64, 1000, 4096, 12345, 60000}
	type key struct{ Seed, Epoch, N uint64 }
	var cases []key
	for _, s := range seeds {
		for _, e := range epochs {
			for _, n := range spaces {
				cases = append(cases, key{s, e, n})
			}
		}
	}
	raw, _ := json.Marshal(cases)
	const script = `import hashlib, json, struct, sys
from cohort_plugin.plan import permutation
out = []
for c in json.loads(sys.argv[1]):
    p = permutation(c["Seed"], c["Epoch"], c["N"])
    out.append(hashlib.sha256(struct.pack("<%dQ" % len(p), *p)).hexdigest())
print(json.dumps(out))`
	var got []string
	if err := json.Unmarshal(runPython(t, script, string(raw)), &got); err != nil || len(got) != len(cases) {
		t.Fatalf("Python's answer: %v (%d digests for %d cases)", err, len(got), len(cases))
	}
	for i, c := range cases {
		if want := permDigest(plugin.Permutation(c.Seed, c.Epoch, c.N)); got[i] != want {
			t.Errorf("permutation(seed %d, epoch %d, %d picks): Python's differs from Go's", c.Seed, c.Epoch, c.N)
		}
	}
}

// Python's Picker slices a plan's picks from the permutation as Go's does,
// and refuses a partition past the pick space.
func TestPickerMatchesGo(t *testing.T) {
	plans := []plugin.Plan{
		{Epoch: 0, PartitionOffset: 0, PartitionSize: 100, Seed: 7, PickSpace: 1000},
		{Epoch: 3, PartitionOffset: 900, PartitionSize: 100, Seed: 7, PickSpace: 1000},
		{Epoch: 3, PartitionOffset: 15000, PartitionSize: 15000, Seed: 1, PickSpace: 60000},
		{Epoch: 1, PartitionOffset: 5, PartitionSize: 0, Seed: 2, PickSpace: 5},
		{Epoch: 1, PartitionOffset: 990, PartitionSize: 11, Seed: 7, PickSpace: 1000},
	}
	raw, _ := json.Marshal(plans)
	const script = `import json, sys
from cohort_plugin.plan import Picker, PlanError
k, out = Picker(), []
for p in json.loads(sys.argv[1]):
    try:
        out.append(k.picks(p["Epoch"], p["Seed"], p["PickSpace"], p["PartitionOffset"], p["PartitionSize"]))
    except PlanError as e:
        out.append(str(e))
print(json.dumps(out, separators=(",", ":")))`
	var got []json.RawMessage
	if err := json.Unmarshal(runPython(t, script, string(raw)), &got); err != nil || len(got) != len(plans) {
		t.Fatalf("Python's answer: %v", err)
	}
	var k plugin.Picker
	for i, p := range plans {
		want, err := k.Picks(p)
		var w []byte
		if err != nil {
			w, _ = json.Marshal(err.Error())
		} else {
			w, _ = json.Marshal(append([]uint64{}, want...))
		}
		if string(w) != string(got[i]) {
			t.Errorf("plan %+v: Python picks %.80s, Go %.80s", p, got[i], w)
		}
	}
}
