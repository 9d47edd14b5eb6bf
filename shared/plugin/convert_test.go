package plugin

import (
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/arena"
	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
	"google.golang.org/protobuf/proto"
)

func TestFromprotoLayout(t *testing.T) {
	entry := func(name string, dt pb.DType, role pb.TensorRole, off uint64) *pb.TensorEntry {
		return &pb.TensorEntry{Name: name, Dtype: dt, Shape: []int64{4}, Offset: off, Nbytes: 16, Role: role}
	}
	f32, param := pb.DType_DTYPE_F32, pb.TensorRole_TENSOR_ROLE_PARAMETER
	cases := []struct {
		name string
		in   *pb.Layout
		want string // error substring; "" means valid
	}{
		{"valid", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", f32, param, 0), entry("b", f32, pb.TensorRole_TENSOR_ROLE_BUFFER, 64)}, Size: 80}, ""},
		{"empty", &pb.Layout{}, ""},
		{"absent", nil, "no layout"},
		{"nil entry", &pb.Layout{Entries: []*pb.TensorEntry{nil}, Size: 16}, "entry 0: empty"},
		{"unspecified dtype", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", pb.DType_DTYPE_UNSPECIFIED, param, 0)}, Size: 16}, `entry 0 ("w"): unknown dtype 0`},
		{"dtype from the future", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", pb.DType(99), param, 0)}, Size: 16}, "unknown dtype 99"},
		{"negative dtype", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", pb.DType(-1), param, 0)}, Size: 16}, "unknown dtype -1"},
		{"unspecified role", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", f32, pb.TensorRole_TENSOR_ROLE_UNSPECIFIED, 0)}, Size: 16}, "unknown tensor role 0"},
		{"role from the future", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", f32, pb.TensorRole(7), 0)}, Size: 16}, "unknown tensor role 7"},
		{"overlap", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", f32, param, 0), entry("b", f32, param, 8)}, Size: 64}, "invalid layout"},
		{"past the end", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", f32, param, 0)}, Size: 8}, "invalid layout"},
		{"duplicate name", &pb.Layout{Entries: []*pb.TensorEntry{entry("w", f32, param, 0), entry("w", f32, param, 64)}, Size: 80}, "invalid layout"},
		{"negative dim", &pb.Layout{Entries: []*pb.TensorEntry{{Name: "w", Dtype: f32, Shape: []int64{-4}, Nbytes: 16, Role: param}}, Size: 16}, "invalid layout"},
		{"huge size", &pb.Layout{Size: 1 << 62}, "invalid layout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, err := fromprotoLayout(tc.in)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			back, err := toprotoLayout(l)
			if err != nil {
				t.Fatal(err)
			}
			if len(back.Entries) != len(tc.in.Entries) || back.Size != tc.in.Size {
				t.Fatalf("round trip changed the layout: %v", back)
			}
			for i := range back.Entries {
				if !proto.Equal(back.Entries[i], tc.in.Entries[i]) {
					t.Errorf("entry %d: %v, want %v", i, back.Entries[i], tc.in.Entries[i])
				}
			}
		})
	}
}

func TestToprotoLayoutRefusesUnknownValues(t *testing.T) {
	for _, e := range []arena.Entry{
		{Name: "w", DType: 0, Role: arena.Parameter},
		{Name: "w", DType: arena.I32 + 1, Role: arena.Parameter},
		{Name: "w", DType: arena.F32, Role: 0},
		{Name: "w", DType: arena.F32, Role: arena.Buffer + 1},
	} {
		if _, err := toprotoLayout(arena.Layout{Entries: []arena.Entry{e}}); err == nil {
			t.Errorf("entry %+v encoded", e)
		}
	}
}
