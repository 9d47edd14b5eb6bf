package reduce

// The payload codec: fixed-width little-endian fields, u32-prefixed strings
// and lists. Decoders check every length against what is left before they
// allocate, and accept only canonical input (it re-encodes to the same
// bytes), which the fuzz targets check.

import (
	"fmt"
	"math"

	"github.com/cohortdl/cohort/shared/authframe"
)

type enc []byte

func (e enc) u8(v uint8) enc    { return append(e, v) }
func (e enc) u32(v uint32) enc  { return le.AppendUint32(e, v) }
func (e enc) u64(v uint64) enc  { return le.AppendUint64(e, v) }
func (e enc) f64(v float64) enc { return e.u64(math.Float64bits(v)) }
func (e enc) str(s string) enc  { return append(e.u32(uint32(len(s))), s...) }
func (e enc) bool(v bool) enc {
	if v {
		return e.u8(1)
	}
	return e.u8(0)
}
func (e enc) raw(b []byte) enc { return append(e, b...) }
func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

type dec struct {
	b    []byte
	what string
	err  error
}

func (d *dec) fail(format string, a ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("reduce: %w: %s: %s", authframe.ErrMalformed, d.what, fmt.Sprintf(format, a...))
	}
}

func (d *dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("needs %d more bytes, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}
func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return le.Uint32(b)
	}
	return 0
}
func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return le.Uint64(b)
	}
	return 0
}
func (d *dec) bool() bool {
	switch v := d.u8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("boolean byte %d", v)
		return false
	}
}

// f64 reads a float that must be finite and not negative.
func (d *dec) f64(field string) float64 {
	v := math.Float64frombits(d.u64())
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		d.fail("%s is %v, want a finite value >= 0", field, v)
		return 0
	}
	return v
}

func (d *dec) str(field string, max int) string {
	n := d.u32()
	if d.err == nil && n > uint32(max) {
		d.fail("%s of %d bytes, limit %d", field, n, max)
		return ""
	}
	return string(d.take(int(n)))
}

// count reads a list length and checks that the list can fit in what is
// left, each element taking at least size bytes, so no decode allocates
// more than its input justifies.
func (d *dec) count(field string, size int) int {
	n := d.u32()
	if d.err != nil {
		return 0
	}
	if n > MaxMembers || int(n) > len(d.b)/size {
		d.fail("%s of %d entries does not fit (%d bytes left, limit %d entries)", field, n, len(d.b), MaxMembers)
		return 0
	}
	return int(n)
}

func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes left over", len(d.b))
	}
	return d.err
}

// Encode returns the payload of j.
func (j Join) Encode() []byte {
	return enc(nil).str(trunc(j.ArenaPath, MaxPath)).u64(j.Dev).u64(j.Ino).u32(j.PID).u32(uint32(j.RingPort))
}

// DecodeJoin decodes a Join payload.
func DecodeJoin(b []byte) (Join, error) {
	d := dec{b: b, what: "join"}
	j := Join{ArenaPath: d.str("arena path", MaxPath), Dev: d.u64(), Ino: d.u64(), PID: d.u32()}
	port := d.u32()
	j.RingPort = uint16(port)
	switch {
	case d.err != nil:
	case j.ArenaPath == "":
		d.fail("empty arena path")
	case port == 0 || port > 0xFFFF:
		d.fail("ring port %d", port)
	}
	return j, d.end()
}

// Encode returns the payload of a.
func (a Announce) Encode() []byte {
	return enc(nil).u64(a.Round).u64(a.Session).u64(a.Steps).f64(a.Weight).bool(a.Broadcast).
		u32(a.Root).u64(a.OuterSteps).raw(a.OuterID[:])
}

// DecodeAnnounce decodes an Announce payload.
func DecodeAnnounce(b []byte) (Announce, error) {
	d := dec{b: b, what: "announce"}
	a := Announce{Round: d.u64(), Session: d.u64(), Steps: d.u64(), Weight: d.f64("weight"),
		Broadcast: d.bool(), Root: d.u32(), OuterSteps: d.u64()}
	copy(a.OuterID[:], d.take(8))
	if d.err == nil && (a.Steps == 0) != (a.Weight == 0) {
		d.fail("weight %v does not match %d steps", a.Weight, a.Steps)
	}
	return a, d.end()
}

// Encode returns the payload of r.
func (r RoundRef) Encode() []byte { return enc(nil).u64(r.Round) }

// DecodeRoundRef decodes a RoundRef payload (kind names the frame).
func DecodeRoundRef(kind Kind, b []byte) (RoundRef, error) {
	d := dec{b: b, what: kind.String()}
	r := RoundRef{Round: d.u64()}
	return r, d.end()
}

// Encode returns the payload of m.
func (m Done) Encode() []byte {
	e := enc(nil).u64(m.Round).f64(m.Post2).u32(uint32(len(m.Parts)))
	for _, p := range m.Parts {
		e = e.u32(p.Rank).f64(p.Diff2).f64(p.Pre2)
	}
	return e
}

// DecodeDone decodes a Done payload.
func DecodeDone(b []byte) (Done, error) {
	d := dec{b: b, what: "done"}
	m := Done{Round: d.u64(), Post2: d.f64("post2")}
	n := d.count("partials", 20)
	if n > 0 {
		m.Parts = make([]Partial, n)
	}
	for i := range m.Parts {
		m.Parts[i] = Partial{Rank: d.u32(), Diff2: d.f64("diff2"), Pre2: d.f64("pre2")}
	}
	return m, d.end()
}

// Encode returns the payload of a.
func (a Abort) Encode() []byte { return enc(nil).u64(a.Round).str(trunc(a.Reason, MaxReason)) }

// DecodeAbort decodes an Abort payload.
func DecodeAbort(b []byte) (Abort, error) {
	d := dec{b: b, what: "abort"}
	a := Abort{Round: d.u64(), Reason: d.str("reason", MaxReason)}
	return a, d.end()
}

// Encode returns the payload of s.
func (s Session) Encode() []byte {
	e := enc(nil).u64(s.Generation).u32(uint32(len(s.Members)))
	for _, m := range s.Members {
		e = e.u32(m)
	}
	return e
}

// DecodeSession decodes a Session payload.
func DecodeSession(b []byte) (Session, error) {
	d := dec{b: b, what: "session"}
	s := Session{Generation: d.u64()}
	n := d.count("members", 4)
	if n > 0 {
		s.Members = make([]uint32, n)
	}
	for i := range s.Members {
		s.Members[i] = d.u32()
	}
	return s, d.end()
}

// Encode returns the payload of t.
func (t Topology) Encode() []byte {
	e := enc(nil).u64(t.Generation).u32(t.Hosts).u32(t.Host).u32(uint32(len(t.Peers)))
	for _, p := range t.Peers {
		e = e.u32(p.Rank).u64(p.Dev).u64(p.Ino).str(trunc(p.Path, MaxPath))
	}
	for _, a := range t.Leaders {
		e = e.str(trunc(a, MaxAddr))
	}
	return e
}

// DecodeTopology decodes a Topology payload.
func DecodeTopology(b []byte) (Topology, error) {
	d := dec{b: b, what: "topology"}
	t := Topology{Generation: d.u64(), Hosts: d.u32(), Host: d.u32()}
	n := d.count("peers", 24)
	if n > 0 {
		t.Peers = make([]Peer, n)
	}
	for i := range t.Peers {
		t.Peers[i] = Peer{Rank: d.u32(), Dev: d.u64(), Ino: d.u64(), Path: d.str("peer path", MaxPath)}
		if d.err == nil && i > 0 && t.Peers[i].Rank <= t.Peers[i-1].Rank {
			d.fail("peers not in increasing rank order")
		}
	}
	if d.err == nil {
		switch {
		case t.Hosts == 0 || t.Host >= t.Hosts || t.Hosts > MaxMembers:
			d.fail("host %d of %d", t.Host, t.Hosts)
		case n == 0:
			d.fail("no peers (the receiver is one)")
		}
	}
	// One address per host; each takes at least its length's 4 bytes, so
	// the slice grows only as input arrives.
	for i := uint32(0); d.err == nil && i < t.Hosts; i++ {
		a := d.str("leader address", MaxAddr)
		if d.err == nil && a == "" {
			d.fail("host %d's leader has no address", i)
		}
		t.Leaders = append(t.Leaders, a)
	}
	return t, d.end()
}

// Encode returns the payload of p.
func (p Plan) Encode() []byte {
	e := enc(nil).u64(p.Round).u64(p.Topology).bool(p.Realized).bool(p.Broadcast).bool(p.Seed).u32(p.Root).
		u32(p.Hosts).f64(p.TotalWeight).f64(p.TotalMovers).u32(uint32(len(p.Parts)))
	for _, q := range p.Parts {
		e = e.u32(q.Rank).f64(q.Weight)
	}
	return e
}

// DecodePlan decodes a Plan payload.
func DecodePlan(b []byte) (Plan, error) {
	d := dec{b: b, what: "plan"}
	p := Plan{Round: d.u64(), Topology: d.u64(), Realized: d.bool(), Broadcast: d.bool(), Seed: d.bool(), Root: d.u32(),
		Hosts: d.u32(), TotalWeight: d.f64("total weight"), TotalMovers: d.f64("total movers")}
	n := d.count("participants", 12)
	if n > 0 {
		p.Parts = make([]PlanPart, n)
	}
	for i := range p.Parts {
		p.Parts[i] = PlanPart{Rank: d.u32(), Weight: d.f64("weight")}
		if d.err == nil && i > 0 && p.Parts[i].Rank <= p.Parts[i-1].Rank {
			d.fail("participants not in increasing rank order")
		}
	}
	if d.err == nil {
		switch {
		case p.Hosts == 0:
			d.fail("zero hosts")
		case n == 0:
			d.fail("no participants (the receiver is one)")
		case p.Realized && !p.Broadcast && p.TotalWeight == 0:
			d.fail("a realized round of total weight 0")
		}
	}
	return p, d.end()
}

// Encode returns the payload of r.
func (r Result) Encode() []byte {
	return enc(nil).u64(r.Round).f64(r.Diff2).f64(r.Pre2).f64(r.Post2).u64(r.Bytes)
}

// DecodeResult decodes a Result payload.
func DecodeResult(b []byte) (Result, error) {
	d := dec{b: b, what: "result"}
	r := Result{Round: d.u64(), Diff2: d.f64("diff2"), Pre2: d.f64("pre2"), Post2: d.f64("post2"), Bytes: d.u64()}
	return r, d.end()
}

// Encode returns the payload of f.
func (f Fail) Encode() []byte { return enc(nil).u64(f.Round).str(trunc(f.Reason, MaxReason)) }

// DecodeFail decodes a Fail payload.
func DecodeFail(b []byte) (Fail, error) {
	d := dec{b: b, what: "fail"}
	f := Fail{Round: d.u64(), Reason: d.str("reason", MaxReason)}
	return f, d.end()
}

// DecodeEmpty checks the empty payload of Bye and pings.
func DecodeEmpty(kind Kind, b []byte) error {
	d := dec{b: b, what: kind.String()}
	return d.end()
}
