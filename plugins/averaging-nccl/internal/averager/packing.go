package averager

// The arena's f32 entries as spans, and their trip through the staging
// buffer that goes to the device and back.

import (
	"fmt"
	"math"

	"github.com/cohortdl/cohort/shared/arena"
)

// span is one f32 entry of the arena: its first element and length, and
// whether it is a parameter (weighted by steps) or a buffer (averaged
// equally among the ranks that trained).
type span struct {
	off, n int
	param  bool
}

// buildSpans lists the arena's f32 entries, parameters first. Other
// parameter types are refused; other buffer types stay local. averaging-cpu
// walks the layout the same way into spans of its own (indexed, empty
// entries dropped): each plugin keeps its walk, as a vendor's would.
func buildSpans(l arena.Layout) (spans []span, np, nb int, err error) {
	if err := l.Validate(); err != nil {
		return nil, 0, 0, fmt.Errorf("averager: %w", err)
	}
	for pass := range 2 {
		for _, e := range l.Entries {
			if (pass == 0) != (e.Role == arena.Parameter) {
				continue
			}
			if e.DType != arena.F32 {
				if e.Role == arena.Parameter {
					return nil, 0, 0, fmt.Errorf("averager: parameter %q is %v; averaging-nccl averages f32 parameters only", e.Name, e.DType)
				}
				continue
			}
			n := int(e.Bytes / 4)
			spans = append(spans, span{off: int(e.Offset / 4), n: n, param: pass == 0})
			if pass == 0 {
				np += n
			} else {
				nb += n
			}
		}
	}
	return spans, np, nb, nil
}

// pack writes the arena's f32 entries into the staging buffer, parameters
// scaled by pw and buffers by bw (1 copies them bit for bit).
func (a *Averager) pack(pw, bw float32) {
	all := arena.AsFloat32s(a.arena.Bytes())
	dst := arena.AsFloat32s(a.staging)
	i := 0
	for _, sp := range a.spans {
		k := bw
		if sp.param {
			k = pw
		}
		for j, x := range all[sp.off : sp.off+sp.n] {
			dst[i+j] = x * k
		}
		i += sp.n
	}
}

// unpack writes the staging buffer back into the arena's f32 entries.
func (a *Averager) unpack() {
	all := arena.AsFloat32s(a.arena.Bytes())
	src := arena.AsFloat32s(a.staging)
	i := 0
	for _, sp := range a.spans {
		copy(all[sp.off:sp.off+sp.n], src[i:i+sp.n])
		i += sp.n
	}
}

// norm is the L2 norm of the f32 parameters, where they are.
func (a *Averager) norm() (float64, error) {
	if a.onDevice {
		n, err := a.be.Norm(a.mem, 0, a.np)
		if err != nil {
			return 0, fmt.Errorf("the parameters' norm on the device: %w", err)
		}
		return n, nil
	}
	all := arena.AsFloat32s(a.arena.Bytes())
	var sum float64
	for _, sp := range a.spans {
		if !sp.param {
			continue
		}
		for _, x := range all[sp.off : sp.off+sp.n] {
			sum += float64(x) * float64(x)
		}
	}
	return math.Sqrt(sum), nil
}
