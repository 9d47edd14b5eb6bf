package plugin

import (
	"slices"
	"testing"
)

func TestPermutationIsAShuffle(t *testing.T) {
	p := Permutation(7, 3, 1000)
	sorted := slices.Clone(p)
	slices.Sort(sorted)
	for i, v := range sorted {
		if v != uint64(i) {
			t.Fatalf("permutation of 0..1000 lacks %d", i)
		}
	}
	if slices.Equal(p, sorted) {
		t.Fatal("permutation is the identity")
	}
	if !slices.Equal(p, Permutation(7, 3, 1000)) {
		t.Fatal("same seed and epoch gave another order")
	}
	if slices.Equal(p, Permutation(7, 4, 1000)) || slices.Equal(p, Permutation(8, 3, 1000)) {
		t.Fatal("another epoch or seed gave the same order")
	}
}

func TestPicker(t *testing.T) {
	var k Picker
	plan := Plan{Epoch: 2, Seed: 9, PickSpace: 100, PartitionOffset: 10, PartitionSize: 20}
	want := Permutation(9, 2, 100)
	got, err := k.Picks(plan)
	if err != nil || !slices.Equal(got, want[10:30]) {
		t.Fatalf("Picks = %v, %v; want %v", got, err, want[10:30])
	}
	// The next chunk of the same epoch reuses the shuffle.
	first := &k.perm[0]
	plan.PartitionOffset, plan.PartitionSize = 30, 70
	got, err = k.Picks(plan)
	if err != nil || !slices.Equal(got, want[30:100]) || &k.perm[0] != first {
		t.Fatalf("second chunk = %v, %v (reshuffled: %v)", got, err, &k.perm[0] != first)
	}
	// Appending to a returned slice must not overwrite the permutation.
	head, _ := k.Picks(Plan{Epoch: 2, Seed: 9, PickSpace: 100, PartitionSize: 5})
	_ = append(head, 12345)
	if k.perm[5] != want[5] {
		t.Fatal("appending to the picks changed the permutation")
	}
	// Another epoch gets its own.
	plan.Epoch = 3
	got, _ = k.Picks(plan)
	if !slices.Equal(got, Permutation(9, 3, 100)[30:100]) {
		t.Fatal("a new epoch reused the old permutation")
	}

	bad := []Plan{
		{PickSpace: 100, PartitionOffset: 90, PartitionSize: 11},
		{PickSpace: 100, PartitionOffset: 101},
		{PickSpace: 100, PartitionOffset: 1, PartitionSize: ^uint64(0)},
	}
	for _, p := range bad {
		if _, err := k.Picks(p); err == nil {
			t.Errorf("Picks(%+v) accepted a partition outside the pick space", p)
		}
	}
}
