package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each launcher convention places a worker without flags; flags win over
// the environment, cohort's own variables over the others; bad or missing
// values are refused naming where they came from.
func TestResolvePlacement(t *testing.T) {
	cases := []struct {
		name    string
		flags   placement
		flagged []string
		env     map[string]string
		want    placement
		wantErr string
	}{
		{name: "flags only", flags: placement{rank: 2, world: 4, localRanks: 2, coordinator: "10.0.0.1:7000"},
			flagged: []string{"rank", "world", "local-ranks", "coordinator"},
			want:    placement{rank: 2, world: 4, localRanks: 2, coordinator: "10.0.0.1:7000"}},
		// torchrun's MASTER_PORT is its rendezvous's: the coordinator's
		// port is cohort's, its host MASTER_ADDR when left out.
		{name: "torchrun", env: map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "head", "MASTER_PORT": "29500", "COHORT_COORDINATOR": ":7000"},
			want: placement{rank: 3, world: 8, localRanks: 4, coordinator: "head:7000"}},
		{name: "torchrun with an IPv6 master", flags: placement{coordinator: ":7000"}, flagged: []string{"coordinator"}, env: map[string]string{"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "fd00::1", "MASTER_PORT": "29500"},
			want: placement{rank: 0, world: 1, localRanks: 1, coordinator: "[fd00::1]:7000"}},
		{name: "torchrun's rendezvous is not the coordinator", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "head", "MASTER_PORT": "29500"}, wantErr: "no coordinator address"},
		{name: "slurm", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2", "COHORT_COORDINATOR": "node1:7000"},
			want: placement{rank: 5, world: 6, localRanks: 2, coordinator: "node1:7000"}},
		{name: "slurm without tasks per node", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "COHORT_COORDINATOR": "node1:7000"},
			want: placement{rank: 0, world: 4, localRanks: 1, coordinator: "node1:7000"}},
		{name: "kubernetes indexed job", env: map[string]string{"JOB_COMPLETION_INDEX": "7", "COHORT_WORLD": "8", "COHORT_COORDINATOR": "cohort-coordinator.ml.svc:7000"},
			want: placement{rank: 7, world: 8, localRanks: 1, coordinator: "cohort-coordinator.ml.svc:7000"}},
		{name: "flags win over the environment", flags: placement{rank: 1, world: 2, coordinator: "a:1"}, flagged: []string{"rank", "world", "coordinator"},
			env:  map[string]string{"RANK": "9", "WORLD_SIZE": "10", "MASTER_ADDR": "b", "MASTER_PORT": "2"},
			want: placement{rank: 1, world: 2, localRanks: 1, coordinator: "a:1"}},
		{name: "cohort's variables win over torchrun's", env: map[string]string{"COHORT_RANK": "1", "RANK": "9", "WORLD_SIZE": "10", "COHORT_COORDINATOR": "a:1", "MASTER_ADDR": "b", "MASTER_PORT": "2"},
			want: placement{rank: 1, world: 10, localRanks: 1, coordinator: "a:1"}},
		{name: "no coordinator", env: map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, wantErr: "no coordinator address"},
		{name: "no rank", env: map[string]string{"WORLD_SIZE": "2", "COHORT_COORDINATOR": "a:1"}, wantErr: "no rank"},
		{name: "no world", env: map[string]string{"JOB_COMPLETION_INDEX": "0", "COHORT_COORDINATOR": "a:1"}, wantErr: "no world size"},
		{name: "rank outside the world", env: map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "4", "COHORT_COORDINATOR": "a:1"}, wantErr: "rank 4 (from $SLURM_PROCID): it must be in 0..3"},
		{name: "not a number", env: map[string]string{"RANK": "one", "WORLD_SIZE": "2", "COHORT_COORDINATOR": "a:1"}, wantErr: `$RANK = "one" (torchrun's rank): not a whole number`},
		{name: "coordinator without a port", env: map[string]string{"RANK": "0", "WORLD_SIZE": "1", "COHORT_COORDINATOR": "head"}, wantErr: `coordinator address "head" (from $COHORT_COORDINATOR)`},
		{name: "too many local ranks", flags: placement{localRanks: 3}, flagged: []string{"local-ranks"},
			env: map[string]string{"RANK": "0", "WORLD_SIZE": "2", "COHORT_COORDINATOR": "a:1"}, wantErr: "local ranks 3 (from --local-ranks)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			flagged := map[string]bool{}
			for _, f := range tc.flagged {
				flagged[f] = true
			}
			if !flagged["local-ranks"] && tc.flags.localRanks == 0 {
				tc.flags.localRanks = 1 // the flag's default
			}
			got, err := resolvePlacement(tc.flags, flagged, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.rank != tc.want.rank || got.world != tc.want.world || got.localRanks != tc.want.localRanks || got.coordinator != tc.want.coordinator {
				t.Errorf("got rank %d world %d local %d coordinator %q, want %+v", got.rank, got.world, got.localRanks, got.coordinator, tc.want)
			}
		})
	}
}

// A relative plugin lock is the config file's neighbour, made absolute so
// the copy of the config a run writes for its workers names the same file.
func TestPluginLockBesideTheConfig(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cohort.hcl")
	cases := []struct {
		body, want string
	}{
		{"", filepath.Join(dir, "cohort.lock.json")},
		{"worker {\n  plugin_lock = \"locks/site.json\"\n}\n", filepath.Join(dir, "locks", "site.json")},
		{"worker {\n  plugin_lock = \"/etc/cohort/lock.json\"\n}\n", "/etc/cohort/lock.json"},
		{"worker {\n  plugin_lock = \"\"\n}\n", ""},
	}
	for _, c := range cases {
		if err := os.WriteFile(cfgPath, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := (&globals{configPath: cfgPath}).loadConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Worker.PluginLock != c.want {
			t.Errorf("config %q: plugin lock %q, want %q", c.body, cfg.Worker.PluginLock, c.want)
		}
	}
}

// A node's host index and count come from its flags or a launcher's
// variables; its coordinator never from torchrun's rendezvous port.
func TestResolveNodePlacement(t *testing.T) {
	cases := []struct {
		name      string
		flags     nodePlacement
		flagged   []string
		env       map[string]string
		wantFirst int
		wantWorld int
		wantCoord string
		wantErr   string
	}{
		{name: "flags", flags: nodePlacement{coordinator: "head:7000", node: 1, nodes: 2, perNode: 4}, flagged: []string{"coordinator", "node", "nodes"},
			wantFirst: 4, wantWorld: 8, wantCoord: "head:7000"},
		{name: "torchrun, one process per host", flags: nodePlacement{coordinator: ":7000", perNode: 3}, flagged: []string{"coordinator"},
			env:       map[string]string{"GROUP_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "head", "MASTER_PORT": "29500"},
			wantFirst: 3, wantWorld: 6, wantCoord: "head:7000"},
		{name: "torchrun's rendezvous port is not the coordinator", flags: nodePlacement{perNode: 1},
			env: map[string]string{"GROUP_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "head", "MASTER_PORT": "29500"}, wantErr: "no coordinator address"},
		{name: "torchrun, a process per rank", flags: nodePlacement{coordinator: "head:7000", perNode: 1}, flagged: []string{"coordinator"},
			env: map[string]string{"GROUP_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, wantErr: "once per host (torchrun --nproc_per_node 1)"},
		{name: "slurm", flags: nodePlacement{perNode: 2}, env: map[string]string{"SLURM_NODEID": "2", "SLURM_NNODES": "3", "COHORT_COORDINATOR": "n0:7000"},
			wantFirst: 4, wantWorld: 6, wantCoord: "n0:7000"},
		{name: "one host needs no index", flags: nodePlacement{coordinator: "a:1", nodes: 1, perNode: 2}, flagged: []string{"coordinator", "nodes"},
			wantFirst: 0, wantWorld: 2, wantCoord: "a:1"},
		{name: "index outside", flags: nodePlacement{coordinator: "a:1", node: 2, nodes: 2, perNode: 1}, flagged: []string{"coordinator", "node", "nodes"},
			wantErr: "host index 2 (from --node): want 0..1"},
		{name: "no host count", flags: nodePlacement{coordinator: "a:1", perNode: 1}, flagged: []string{"coordinator"}, wantErr: "no host count"},
		{name: ":PORT without MASTER_ADDR", flags: nodePlacement{coordinator: ":7000", nodes: 1, perNode: 1}, flagged: []string{"coordinator", "nodes"},
			wantErr: "names no host, and $MASTER_ADDR is not set"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			flagged := map[string]bool{}
			for _, f := range tc.flagged {
				flagged[f] = true
			}
			got, err := tc.flags.resolve(flagged, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			first, world := got.ranks()
			if first != tc.wantFirst || world != tc.wantWorld || got.coordinator != tc.wantCoord {
				t.Errorf("ranks from %d of %d at %q, want from %d of %d at %q", first, world, got.coordinator, tc.wantFirst, tc.wantWorld, tc.wantCoord)
			}
		})
	}
}
