package numeric

import "fmt"

// OuterKind names an outer optimizer.
type OuterKind int

// The outer optimizers.
const (
	// OuterNone keeps the consensus as the new global parameters.
	OuterNone OuterKind = iota
	// OuterSlowMo is slow momentum: v = mu*v + g; new = prev - lr*v.
	OuterSlowMo
	// OuterDiLoCo is Nesterov momentum: v = mu*v + g;
	// new = prev - lr*(mu*v + g). Each rank's inner optimizer (the
	// trainer's) keeps its state across rounds, as in DiLoCo's algorithm.
	OuterDiLoCo
	// OuterTrack keeps the consensus, as OuterNone does, and records it as
	// prev: the base a bf16 wire's differences need when no other outer
	// optimizer keeps one. No setting names it.
	OuterTrack
)

func (k OuterKind) String() string {
	switch k {
	case OuterNone:
		return "none"
	case OuterSlowMo:
		return "slowmo"
	case OuterDiLoCo:
		return "diloco"
	case OuterTrack:
		return "track"
	}
	return fmt.Sprintf("outer(%d)", int(k))
}

// ParseOuter maps a settings name to an OuterKind.
func ParseOuter(s string) (OuterKind, error) {
	switch s {
	case "none", "":
		return OuterNone, nil
	case "slowmo":
		return OuterSlowMo, nil
	case "diloco":
		return OuterDiLoCo, nil
	}
	return 0, fmt.Errorf("unknown outer optimizer %q (want none, slowmo or diloco)", s)
}

// Outer is an outer optimizer's hyper-parameters. It steps parameters
// only; buffers pass through.
type Outer struct {
	Kind   OuterKind
	LR, Mu float32
}

// Step runs one outer step over a block. c holds the consensus and receives
// the new global parameters; prev (the previous global parameters) and v
// (the velocity) are the optimizer's state and are updated. With the
// pseudo-gradient g = prev - c:
//
//	SlowMo:  v = mu*v + g;  new = prev - lr*v
//	DiLoCo:  v = mu*v + g;  new = prev - lr*(mu*v + g)
//
// and prev becomes new. seed marks the first window: prev = c and v = 0,
// so new = c.
func (o Outer) Step(c, prev, v []float32, seed bool) {
	if o.Kind == OuterNone {
		return
	}
	prev = prev[:len(c)]
	v = v[:len(c)]
	if seed || o.Kind == OuterTrack {
		copy(prev, c)
		clear(v)
		return
	}
	lr, mu := o.LR, o.Mu
	switch o.Kind {
	case OuterSlowMo:
		slowMo(c, prev, v, lr, mu)
	case OuterDiLoCo:
		for i, ci := range c {
			p := prev[i]
			g := p - ci
			vi := mu*v[i] + g
			n := p - lr*(mu*vi+g)
			v[i], prev[i], c[i] = vi, n, n
		}
	}
}

// slowMoGo is the SlowMo step over c, prev and v of one length.
func slowMoGo(c, prev, v []float32, lr, mu float32) {
	prev, v = prev[:len(c)], v[:len(c)]
	for i, ci := range c {
		p := prev[i]
		vi := mu*v[i] + (p - ci)
		n := p - lr*vi
		v[i], prev[i], c[i] = vi, n, n
	}
}
