package plugintest

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/cohortdl/cohort/shared/plugin"
)

// RelayGroup is an in-process relay for testing averagers without a
// coordinator: the promises of plugin.Relay, kept among goroutines. An
// exchange completes once every live rank has posted under its key; Kill
// fails the exchanges in flight, as the coordinator does when a rank dies,
// and later exchanges wait for the survivors only.
type RelayGroup struct {
	mu      sync.Mutex
	world   uint32
	dead    map[uint32]bool
	pending map[string]*relayExchange
	failed  map[string]string // key -> why
}

type relayExchange struct {
	posted map[uint32][]byte
	done   chan struct{}
	result map[uint32][]byte
	err    error
}

// NewRelayGroup makes the relay of a world of world ranks.
func NewRelayGroup(world uint32) *RelayGroup {
	return &RelayGroup{world: world, dead: map[uint32]bool{}, pending: map[string]*relayExchange{}, failed: map[string]string{}}
}

// Relay is rank's view of the group.
func (g *RelayGroup) Relay(rank uint32) plugin.Relay { return groupRelay{g: g, rank: rank} }

// Kill takes rank out of the group: every exchange in flight fails as
// aborted, and so does every later post under its key.
func (g *RelayGroup) Kill(rank uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dead[rank] = true
	why := fmt.Sprintf("rank %d died before the exchange completed", rank)
	for key, ex := range g.pending {
		ex.err = fmt.Errorf("relay key %q: %w: %s", key, plugin.ErrRoundAborted, why)
		close(ex.done)
		g.failed[key] = why
		delete(g.pending, key)
	}
}

type groupRelay struct {
	g    *RelayGroup
	rank uint32
}

func (r groupRelay) Exchange(ctx context.Context, key string, blob []byte) (map[uint32][]byte, error) {
	g := r.g
	if len(blob) > plugin.MaxRelayBlob {
		return nil, fmt.Errorf("relay key %q: blob of %d bytes, limit %d", key, len(blob), plugin.MaxRelayBlob)
	}
	g.mu.Lock()
	if r.rank >= g.world || g.dead[r.rank] {
		g.mu.Unlock()
		return nil, fmt.Errorf("relay key %q: rank %d is not a live rank of a world of %d", key, r.rank, g.world)
	}
	if why, ok := g.failed[key]; ok {
		g.mu.Unlock()
		return nil, fmt.Errorf("relay key %q: %w: %s", key, plugin.ErrRoundAborted, why)
	}
	ex := g.pending[key]
	if ex == nil {
		ex = &relayExchange{posted: map[uint32][]byte{}, done: make(chan struct{})}
		g.pending[key] = ex
	}
	if _, dup := ex.posted[r.rank]; dup {
		g.mu.Unlock()
		return nil, fmt.Errorf("relay key %q: rank %d posted twice", key, r.rank)
	}
	ex.posted[r.rank] = append([]byte(nil), blob...)
	if len(ex.posted) == int(g.world)-len(g.dead) {
		ex.result = ex.posted
		close(ex.done)
		delete(g.pending, key)
	}
	g.mu.Unlock()

	select {
	case <-ex.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("relay key %q: %w", key, ctx.Err())
	}
	if ex.err != nil {
		return nil, ex.err
	}
	return maps.Clone(ex.result), nil
}
