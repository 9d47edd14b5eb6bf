package checkpoint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/coordinator/dispatch"
)

func TestLastCheckpointPicksNewestComplete(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, complete bool) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if complete {
			if err := os.WriteFile(filepath.Join(p, MetaFile), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("ckpt-000002", true)
	mk("ckpt-000010", true)
	mk("ckpt-000011", false) // no meta.json: incomplete
	mk(".tmp-ckpt-000012", true)
	mk("notes", true)
	got, err := LastCheckpoint(dir)
	if err != nil || filepath.Base(got) != "ckpt-000010" {
		t.Fatalf("LastCheckpoint = %q, %v; want ckpt-000010", got, err)
	}
	store, removed, err := openCkptStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if store.next != 12 || len(removed) != 1 || filepath.Base(removed[0]) != ".tmp-ckpt-000012" {
		t.Errorf("store numbers from %d (want 12), removed %v", store.next, removed)
	}
	if _, err := LastCheckpoint(t.TempDir()); err == nil {
		t.Error("an empty directory has no checkpoint")
	}
}

func TestReadMetaRefusesBadCheckpoints(t *testing.T) {
	good := Meta{SchemaVersion: 1, PickSpace: 100, Epochs: 2,
		Remaining: []dispatch.RankRanges{{Rank: 0, Ranges: []dispatch.Range{{Offset: 0, Size: 50}}}, {Rank: 1, Ranges: []dispatch.Range{{Offset: 50, Size: 50}}}}}
	cases := []struct {
		name   string
		mutate func(m *Meta)
		bad    string
	}{
		{"good", func(*Meta) {}, ""},
		{"newer schema", func(m *Meta) { m.SchemaVersion = 99 }, "schema_version 99"},
		{"overlap", func(m *Meta) { m.Pool = []dispatch.Range{{Offset: 40, Size: 5}} }, "overlaps"},
		{"past the data", func(m *Meta) { m.Remaining[1].Ranges[0].Size = 51 }, "does not fit"},
		{"rank twice", func(m *Meta) { m.Remaining[1].Rank = 0 }, "twice"},
		{"no samples", func(m *Meta) { m.PickSpace = 0 }, "pick_space"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := good
			m.Remaining = []dispatch.RankRanges{{Rank: 0, Ranges: []dispatch.Range{{Offset: 0, Size: 50}}}, {Rank: 1, Ranges: []dispatch.Range{{Offset: 50, Size: 50}}}}
			tc.mutate(&m)
			dir := t.TempDir()
			b, _ := json.Marshal(m)
			os.WriteFile(filepath.Join(dir, MetaFile), b, 0o644)
			_, err := ReadMeta(dir)
			if (tc.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
				t.Errorf("ReadMeta: %v, want %q", err, tc.bad)
			}
		})
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, MetaFile), []byte("{not json"), 0o644)
	if _, err := ReadMeta(dir); err == nil {
		t.Error("garbage meta.json accepted")
	}
}

func TestResolveCheckpoint(t *testing.T) {
	out := t.TempDir()
	ck := filepath.Join(out, CheckpointsDir, "ckpt-000003")
	os.MkdirAll(ck, 0o755)
	os.WriteFile(filepath.Join(ck, MetaFile), []byte("{}"), 0o644)
	for _, p := range []string{out, filepath.Join(out, CheckpointsDir), ck} {
		got, err := ResolveCheckpoint(p)
		if err != nil || got != ck {
			t.Errorf("ResolveCheckpoint(%s) = %q, %v; want %s", p, got, err, ck)
		}
	}
	if _, err := ResolveCheckpoint(t.TempDir()); err == nil {
		t.Error("a directory without checkpoints resolved")
	}
}

// prune keeps the newest complete checkpoints and leaves what is not one
// (an incomplete checkpoint, a temp directory, other files) alone.
func TestPruneKeepsTheNewest(t *testing.T) {
	for _, tc := range []struct {
		keep int
		want []string
	}{
		{0, []string{".tmp-ckpt-000007", "ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004", "ckpt-000006", "notes"}},
		{2, []string{".tmp-ckpt-000007", "ckpt-000003", "ckpt-000004", "ckpt-000006", "notes"}},
		{1, []string{".tmp-ckpt-000007", "ckpt-000004", "ckpt-000006", "notes"}},
		{9, []string{".tmp-ckpt-000007", "ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004", "ckpt-000006", "notes"}},
	} {
		dir := t.TempDir()
		for _, name := range []string{"ckpt-000001", "ckpt-000002", "ckpt-000003", "ckpt-000004", "ckpt-000006", ".tmp-ckpt-000007", "notes"} {
			if err := os.MkdirAll(filepath.Join(dir, name, "rank-0"), 0o755); err != nil {
				t.Fatal(err)
			}
			if name != "ckpt-000006" { // incomplete: no meta.json
				if err := os.WriteFile(filepath.Join(dir, name, MetaFile), []byte("{}"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := (&ckptStore{dir: dir}).prune(tc.keep); err != nil {
			t.Fatal(err)
		}
		entries, _ := os.ReadDir(dir)
		var got []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("keep %d: left %v, want %v", tc.keep, got, tc.want)
		}
	}
}
