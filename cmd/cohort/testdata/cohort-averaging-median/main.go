// Command cohort-averaging-median is an averager written as a vendor would
// write one, from shared/ alone, for the CLI's tests: it is neither of the
// built-in averagers, and its ranks meet through the coordinator's relay
// and nothing else. A round takes the coordinate-wise median of the ranks
// that trained (robust to one rank gone wrong); a broadcast copies the
// root's values.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

func main() {
	plugin.Serve(plugin.ServeOptions{
		Name:     "averaging-median",
		Averager: func(log hclog.Logger) (plugin.Averager, error) { return &median{log: log}, nil },
	})
}

type median struct {
	log hclog.Logger

	mu      sync.Mutex
	m       *arena.Mapping
	floats  []int
	count   int
	relay   plugin.Relay
	rank    uint32
	members []uint32
	gen     uint64
	aborted context.Context
	abort   context.CancelCauseFunc
}

func (a *median) Describe(context.Context) (plugin.Description, error) {
	// It takes no settings: an empty schema, so the core refuses any.
	return plugin.Description{Name: "median", Version: "1.0.0", Meeting: plugin.MeetRelay, Settings: []plugin.SettingSpec{}}, nil
}

func (a *median) Configure(_ context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	if cfg.Relay == nil {
		return plugin.AveragerTraits{}, errors.New("median: the host offers no relay")
	}
	m, err := arena.Open(cfg.Arena)
	if err != nil {
		return plugin.AveragerTraits{}, fmt.Errorf("median: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.m, a.relay, a.rank, a.floats, a.count = m, cfg.Relay, cfg.Rank, nil, 0
	for i, e := range cfg.Arena.Layout.Entries {
		if e.DType == arena.F32 {
			a.floats = append(a.floats, i)
			a.count += int(e.Bytes / 4)
		}
	}
	if blob := 8 + 4*a.count; blob > plugin.MaxRelayExchange/int(cfg.WorldSize) {
		return plugin.AveragerTraits{}, fmt.Errorf("median: %d-byte contributions from %d ranks exceed one relay exchange", blob, cfg.WorldSize)
	}
	a.members = nil
	for r := range cfg.WorldSize {
		a.members = append(a.members, r)
	}
	a.renewLocked()
	// The median of one rank's values is those values.
	return plugin.AveragerTraits{SoloIdentity: true}, nil
}

func (a *median) renewLocked() {
	if a.abort != nil {
		a.abort(errors.New("superseded"))
	}
	a.aborted, a.abort = context.WithCancelCause(context.Background())
}

func (a *median) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	a.mu.Lock()
	m, relay, members, gen, aborted := a.m, a.relay, a.members, a.gen, a.aborted
	a.mu.Unlock()
	if m == nil {
		return plugin.RoundResult{}, errors.New("median: not configured")
	}
	values := make([]float32, 0, a.count)
	for _, i := range a.floats {
		t, err := m.Float32s(i)
		if err != nil {
			return plugin.RoundResult{}, err
		}
		values = append(values, t...)
	}
	blob := binary.LittleEndian.AppendUint64(nil, r.Steps)
	for _, v := range values {
		blob = binary.LittleEndian.AppendUint32(blob, math.Float32bits(v))
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(aborted, cancel)
	defer stop()
	got, err := relay.Exchange(rctx, fmt.Sprintf("median/g%d/r%d", gen, r.Round), blob)
	if aborted.Err() != nil {
		return plugin.RoundResult{}, fmt.Errorf("median: round %d: %w: %v", r.Round, plugin.ErrRoundAborted, context.Cause(aborted))
	}
	if err != nil {
		return plugin.RoundResult{}, fmt.Errorf("median: round %d: %w", r.Round, err)
	}
	peers := map[uint32][]float32{}
	var total float64
	for rank, b := range got {
		if len(b) != len(blob) {
			return plugin.RoundResult{}, fmt.Errorf("median: rank %d sent %d bytes, want %d", rank, len(b), len(blob))
		}
		steps := binary.LittleEndian.Uint64(b)
		total += float64(steps)
		if steps == 0 && !r.Broadcast {
			continue
		}
		vals := make([]float32, a.count)
		for k := range vals {
			vals[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[8+4*k:]))
		}
		peers[rank] = vals
	}
	res := plugin.RoundResult{Weight: float64(r.Steps), TotalWeight: total, BytesMoved: uint64(len(blob) * len(got))}
	var out []float32
	switch {
	case r.Broadcast:
		if int(r.Root) >= len(members) || peers[members[r.Root]] == nil {
			return plugin.RoundResult{}, fmt.Errorf("median: round %d: %w: the broadcast root posted nothing", r.Round, plugin.ErrRoundAborted)
		}
		out = peers[members[r.Root]]
	case len(peers) > 0:
		ranks := slices.Sorted(maps.Keys(peers))
		out = make([]float32, a.count)
		col := make([]float32, len(ranks))
		for k := range out {
			for j, rank := range ranks {
				col[j] = peers[rank][k]
			}
			slices.Sort(col)
			if n := len(col); n%2 == 1 {
				out[k] = col[n/2]
			} else {
				out[k] = (col[n/2-1] + col[n/2]) / 2
			}
		}
	default:
		return res, nil // nobody trained: the arena keeps its values
	}
	res.Realized = true
	off := 0
	var diff, norm float64
	for _, i := range a.floats {
		t, _ := m.Float32s(i)
		for j := range t {
			d := float64(t[j] - out[off+j])
			diff, norm = diff+d*d, norm+float64(out[off+j])*float64(out[off+j])
			t[j] = out[off+j]
		}
		off += len(t)
	}
	res.PostNorm = math.Sqrt(norm)
	if res.PostNorm > 0 {
		res.Divergence = math.Sqrt(diff) / res.PostNorm
	}
	return res, nil
}

func (a *median) NewSessionID(context.Context) ([]byte, error) {
	id := make([]byte, 16)
	_, err := rand.Read(id)
	return id, err
}

func (a *median) NewSession(_ context.Context, s plugin.Session) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.members, a.gen = append([]uint32(nil), s.Members...), s.Generation
	a.renewLocked()
	return nil
}

func (a *median) Abort(_ context.Context, reason string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.abort != nil {
		a.abort(errors.New(reason))
	}
	return nil
}

func (a *median) SaveState(context.Context, string) ([]string, error) { return nil, nil }
func (a *median) LoadState(context.Context, string) error             { return nil }

func (a *median) Shutdown(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.abort != nil {
		a.abort(errors.New("shut down"))
	}
	if a.m == nil {
		return nil
	}
	err := a.m.Close()
	a.m = nil
	return err
}
