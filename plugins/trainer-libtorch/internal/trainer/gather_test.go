package trainer

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestShimGatherMatchesDataset: the shim's batch gather, which every
// training batch goes through, gives the same features to the bit, and
// the same labels or targets, as the data set's own Gather, on every kind
// of data set, for batches long and short (the byte path scales eight at
// a time and fetches rows ahead: tails and the first rows matter); a
// sample outside the set is refused, not read.
func TestShimGatherMatchesDataset(t *testing.T) {
	needTorch(t)
	for name, data := range runsData(t) {
		t.Run(name, func(t *testing.T) {
			tr, _ := runsTrainer(t, data)
			d := tr.train
			if u8, _, _, _ := d.Arrays(); (u8 != nil) != strings.HasPrefix(name, "byte") {
				t.Fatalf("features kept as bytes: %v, want %v", u8 != nil, strings.HasPrefix(name, "byte"))
			}
			sd := shimData(d)
			rng := rand.New(rand.NewPCG(7, 8))
			buf := make([]byte, 4096)
			for _, n := range []int{1, 3, 8, 9, 64, d.N()} {
				idx := make([]uint64, n)
				for i := range idx {
					idx[i] = uint64(rng.IntN(d.N()))
				}
				f, w := d.Features(), d.Width()
				want, got := make([]float32, n*f), make([]float32, n*f)
				var wy, gy []int64
				var wt, gt []float32
				if d.Labels() != nil {
					wy, gy = make([]int64, n), make([]int64, n)
				} else {
					wt, gt = make([]float32, n*w), make([]float32, n*w)
				}
				d.Gather(idx, want, wy, wt)
				if err := tr.shim.Gather(sd, idx, got, gy, gt, buf); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%d samples: feature %d of sample %d is %v, want %v", n, i%f, idx[i/f], got[i], want[i])
					}
				}
				for i := range wy {
					if gy[i] != wy[i] {
						t.Fatalf("%d samples: label %d is %d, want %d", n, i, gy[i], wy[i])
					}
				}
				for i := range wt {
					if math.Float32bits(gt[i]) != math.Float32bits(wt[i]) {
						t.Fatalf("%d samples: target %d is %v, want %v", n, i, gt[i], wt[i])
					}
				}
			}
			x, y, tg := make([]float32, 2*d.Features()), make([]int64, 2), make([]float32, 2*max(d.Width(), 1))
			err := tr.shim.Gather(sd, []uint64{0, uint64(d.N())}, x, y, tg, buf)
			if err == nil || !strings.Contains(err.Error(), "outside the data set") {
				t.Fatalf("gathering sample %d of %d: %v, want it refused as outside the data set", d.N(), d.N(), err)
			}
		})
	}
}

// TestByteFeaturesKeptByDefault: on x86-64 with AVX2, where the shim's
// gather scales bytes eight at a time, a trainer configured without
// widen_mb keeps byte features as bytes (a quarter of the memory, and no
// slower to gather); elsewhere it widens them to float32 at load.
func TestByteFeaturesKeptByDefault(t *testing.T) {
	needTorch(t)
	data := runsData(t)["byte features, labels"]
	delete(data, "widen_mb")
	tr, _ := runsTrainer(t, data)
	u8, f32, _, _ := tr.train.Arrays()
	kept := runtime.GOARCH == "amd64" && cpu.X86.HasAVX2
	if (u8 != nil) != kept || (f32 != nil) == kept {
		t.Fatalf("byte features kept as bytes: %v (floats: %v), want %v on %s (AVX2: %v)", u8 != nil, f32 != nil, kept, runtime.GOARCH, cpu.X86.HasAVX2)
	}
}
