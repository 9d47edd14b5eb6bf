package plugintest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cohortdl/cohort/shared/plugin"
)

// The mock averager's traffic: the contribution it posts to the relay,
// and the exchange and checks of one round's contributions.

// A contribution, as one rank posts it to the relay: this header, then the
// raw little-endian values of every f32 entry of the layout, in layout
// order.
//
//	0  magic "COHMAVG1"     8  round u64        16 generation u64
//	24 session-ID hash u64  32 reserved u64     40 global rank u32
//	44 reserved u32         48 steps u64        56 weight f64
//	64 layout digest [32]   96 value count u64  104 values
const (
	contribMagic  = "COHMAVG1"
	contribHeader = 104
)

// contribution is a parsed contribution header.
type contribution struct {
	round, gen, session uint64
	rank                uint32
	steps               uint64
	weight              float64
	digest              [32]byte
	count               uint64
}

func (c *contribution) encode(b []byte) {
	copy(b, contribMagic)
	le := binary.LittleEndian
	le.PutUint64(b[8:], c.round)
	le.PutUint64(b[16:], c.gen)
	le.PutUint64(b[24:], c.session)
	le.PutUint64(b[32:], 0)
	le.PutUint32(b[40:], c.rank)
	le.PutUint32(b[44:], 0)
	le.PutUint64(b[48:], c.steps)
	le.PutUint64(b[56:], math.Float64bits(c.weight))
	copy(b[64:96], c.digest[:])
	le.PutUint64(b[96:], c.count)
}

func decodeContribution(b []byte) (contribution, error) {
	if len(b) < contribHeader {
		return contribution{}, fmt.Errorf("%d bytes, shorter than the %d-byte header", len(b), contribHeader)
	}
	if string(b[:8]) != contribMagic {
		return contribution{}, errors.New("not a mock averager contribution (bad magic)")
	}
	le := binary.LittleEndian
	c := contribution{
		round:   le.Uint64(b[8:]),
		gen:     le.Uint64(b[16:]),
		session: le.Uint64(b[24:]),
		rank:    le.Uint32(b[40:]),
		steps:   le.Uint64(b[48:]),
		weight:  math.Float64frombits(le.Uint64(b[56:])),
		count:   le.Uint64(b[96:]),
	}
	copy(c.digest[:], b[64:96])
	return c, nil
}

// exchange posts a.buf through the relay under round r's key and returns
// every poster's contribution by global rank. An Abort of the session ends
// the wait; so does a peer's death, which the relay reports as an aborted
// round.
func (a *Averager) exchange(ctx context.Context, r uint64, s session) (map[uint32][]byte, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-s.abort.done:
			cancel()
		case <-watch:
		}
	}()
	// The relay bounds one exchange, so a large contribution goes in
	// chunks, one key each; a rank that died between chunks posted only
	// some, and counts as not posted.
	key := fmt.Sprintf("mock/g%d/%016x/r%d", s.gen, s.hash, r)
	chunk := min(plugin.MaxRelayBlob, plugin.MaxRelayExchange/len(s.members))
	posted := map[uint32][]byte{}
	var got map[uint32][]byte
	var err error
	for off, c := 0, 0; off < len(a.buf) && err == nil; off, c = off+chunk, c+1 {
		got, err = a.relay.Exchange(rctx, fmt.Sprintf("%s/c%d", key, c), a.buf[off:min(off+chunk, len(a.buf))])
		for rank, b := range got {
			posted[rank] = append(posted[rank], b...)
		}
	}
	close(watch)
	<-done
	select {
	case <-s.abort.done:
		return nil, fmt.Errorf("%w: %s", ErrAborted, a.why(s.abort))
	default:
	}
	if err != nil {
		return nil, fmt.Errorf("relay exchange %s: %w", key, err)
	}
	for rank := range posted {
		if _, ok := got[rank]; !ok {
			delete(posted, rank)
		}
	}
	if _, ok := posted[s.rank]; !ok {
		return nil, fmt.Errorf("relay exchange %s: the result lacks this rank's own contribution", key)
	}
	return posted, nil
}

// checkContribution checks rank's blob of round r against the session and
// the layout.
func (a *Averager) checkContribution(blob []byte, r uint64, rank uint32, s session) (contribution, error) {
	c, err := decodeContribution(blob)
	if err != nil {
		return contribution{}, fmt.Errorf("rank %d's contribution: %w", rank, err)
	}
	switch {
	case c.round != r || c.rank != rank:
		return contribution{}, fmt.Errorf("rank %d's contribution holds round %d of rank %d", rank, c.round, c.rank)
	case c.gen != s.gen || c.session != s.hash:
		return contribution{}, fmt.Errorf("rank %d's contribution belongs to session generation %d, this is %d", rank, c.gen, s.gen)
	case c.digest != a.digest:
		return contribution{}, fmt.Errorf("rank %d's contribution was written for a different layout", rank)
	case c.count != uint64(a.count):
		return contribution{}, fmt.Errorf("rank %d's contribution holds %d values, the layout has %d", rank, c.count, a.count)
	case len(blob) != contribHeader+4*a.count:
		return contribution{}, fmt.Errorf("rank %d's contribution is %d bytes, want %d", rank, len(blob), contribHeader+4*a.count)
	case !(c.weight >= 0) || math.IsInf(c.weight, 0):
		return contribution{}, fmt.Errorf("rank %d's contribution has weight %v", rank, c.weight)
	}
	return c, nil
}

// values decodes a checked contribution's values into a.peer.
func (a *Averager) values(blob []byte) []float32 {
	for k := range a.peer {
		a.peer[k] = math.Float32frombits(binary.LittleEndian.Uint32(blob[contribHeader+4*k:]))
	}
	return a.peer
}
