package averager

// What the ranks post through the relay, and under which keys: a
// member's GPU place when a session is laid out, and its weighing in a
// round on shared GPUs. Each decoder refuses a post of the wrong size.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cohortdl/cohort/plugins/averaging-nccl/internal/backend"
)

// gpuPost is what a member posts when a session is laid out: its device
// memory's size and handle, then its GPU's name.
type gpuPost struct {
	size   uint64
	handle backend.IPCHandle
	gpu    string
}

// maxGPUName bounds a posted GPU name (a boot id and a PCI bus id are
// under 64 bytes).
const maxGPUName = 256

func (p gpuPost) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, p.size)
	b = append(b, p.handle[:]...)
	return append(b, p.gpu...)
}

func decodeGPUPost(b []byte) (gpuPost, error) {
	var p gpuPost
	n := 8 + len(p.handle)
	if len(b) <= n || len(b) > n+maxGPUName {
		return p, fmt.Errorf("%d bytes, not a size, a handle and a GPU name of 1 to %d bytes", len(b), maxGPUName)
	}
	p.size = binary.LittleEndian.Uint64(b)
	copy(p.handle[:], b[8:])
	p.gpu = string(b[n:])
	return p, nil
}

// exchange posts blob under the round's key for step and returns every
// member's post; it is also the round's barrier.
func (a *Averager) exchange(ctx context.Context, step string, round uint64, blob []byte) (map[uint32][]byte, error) {
	key := fmt.Sprintf("nccl-%s/g%d/r%d", step, a.sess.gen, round)
	got, err := a.relay.Exchange(ctx, key, blob)
	if err != nil {
		return nil, fmt.Errorf("relay exchange %s: %w", key, err)
	}
	return got, nil
}

// weighing is one member's part in a mean: its weight, whether it
// trained, and its smoothing setting and step count.
type weighing struct {
	w, trained, sm float64
	steps          uint64
}

const weighingSize = 32

func (x weighing) encode() []byte {
	b := make([]byte, 0, weighingSize)
	for _, v := range []float64{x.w, x.trained, x.sm} {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return binary.LittleEndian.AppendUint64(b, x.steps)
}

func decodeWeighing(b []byte) (weighing, error) {
	if len(b) != weighingSize {
		return weighing{}, fmt.Errorf("%d bytes, not a weighing of %d", len(b), weighingSize)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])) }
	return weighing{w: f(0), trained: f(1), sm: f(2), steps: binary.LittleEndian.Uint64(b[24:])}, nil
}
