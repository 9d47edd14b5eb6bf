package trainer

import (
	"context"
	"slices"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
)

// The device block holds the f32 parameters, then the f32 buffers, each in
// layout order, as averagers pack them; other entries stay on the arena.
func TestDeviceOffsets(t *testing.T) {
	l, err := arena.Pack([]arena.Entry{
		{Name: "bn.running_mean", DType: arena.F32, Shape: []int64{4}, Role: arena.Buffer},
		{Name: "fc.weight", DType: arena.F32, Shape: []int64{2, 3}, Role: arena.Parameter},
		{Name: "bn.num_batches", DType: arena.I64, Shape: []int64{1}, Role: arena.Buffer},
		{Name: "fc.bias", DType: arena.F32, Shape: []int64{2}, Role: arena.Parameter},
		{Name: "emb.half", DType: arena.F16, Shape: []int64{8}, Role: arena.Buffer},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := deviceOffsets(l), []int64{32, 0, -1, 24, -1}; !slices.Equal(got, want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
	if l.DeviceBytes() != 48 {
		t.Errorf("DeviceBytes %d, want 48", l.DeviceBytes())
	}
}

// A model on the CPU keeps its parameters in the arena: ExportDevice says
// so without an error, and the trainer still works from the arena.
func TestExportDeviceOnTheCPU(t *testing.T) {
	tr := newTestTrainer(t)
	setup := configure(t, tr, merge(synthData(t, 64, 8, 3), map[string]any{"hidden": []int{4}, "threads": 1}))
	if _, _, err := tr.ExportDevice(context.Background()); err == nil {
		t.Fatal("ExportDevice before Attach: no error")
	}
	attach(t, tr, setup)
	if b, ok, err := tr.ExportDevice(context.Background()); ok || err != nil || b != (arena.DeviceBlock{}) {
		t.Fatalf("ExportDevice on the CPU = %+v, %v, %v; want none", b, ok, err)
	}
	if _, err := tr.Publish(context.Background()); err != nil {
		t.Fatal(err)
	}
}
