package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pb "github.com/cohortdl/cohort/shared/plugin/internal/pluginpb"
)

// The relay crosses the plugin boundary the other way round: the host
// serves cohort.v1.Relay on a go-plugin broker connection and names it in
// Configure; the plugin dials it and hands the averager a Relay that calls
// back into the host.

// hostRelay is the host's side: one broker server per plugin client,
// started at the first Configure that carries a Relay, serving whichever
// Relay the latest Configure named. go-plugin's broker owns the serving
// goroutine and ends it when the plugin client is killed.
type hostRelay struct {
	broker *goplugin.GRPCBroker
	once   sync.Once
	id     uint32
	cur    atomic.Pointer[Relay]
}

// serve makes r the relay the plugin reaches and returns the broker id to
// send it.
func (h *hostRelay) serve(r Relay) uint32 {
	h.cur.Store(&r)
	h.once.Do(func() {
		h.id = h.broker.NextId()
		go h.broker.AcceptAndServe(h.id, func(opts []grpc.ServerOption) *grpc.Server {
			s := grpc.NewServer(append(opts, serverOptions()...)...)
			pb.RegisterRelayServer(s, &relayServer{cur: &h.cur})
			return s
		})
	})
	return h.id
}

// relayServer serves the host's current Relay.
type relayServer struct {
	pb.UnimplementedRelayServer
	cur *atomic.Pointer[Relay]
}

func (s *relayServer) Exchange(ctx context.Context, req *pb.RelayExchangeRequest) (*pb.RelayExchangeResponse, error) {
	r := s.cur.Load()
	if r == nil {
		return nil, invalidRequest("Exchange", fmt.Errorf("no relay is configured"))
	}
	if len(req.GetBlob()) > MaxRelayBlob {
		return nil, invalidRequest("Exchange", fmt.Errorf("blob of %d bytes under key %q, limit %d", len(req.GetBlob()), req.GetKey(), MaxRelayBlob))
	}
	blobs, err := (*r).Exchange(ctx, req.GetKey(), req.GetBlob())
	if err != nil {
		return nil, statusError(err)
	}
	resp := &pb.RelayExchangeResponse{Entries: make([]*pb.RelayEntry, 0, len(blobs))}
	for _, rank := range slices.Sorted(maps.Keys(blobs)) {
		resp.Entries = append(resp.Entries, &pb.RelayEntry{Rank: rank, Blob: blobs[rank]})
	}
	return resp, nil
}

// pluginRelay is the Relay an averager gets inside a plugin process: each
// Exchange is one call back to the host.
type pluginRelay struct {
	rpc pb.RelayClient
}

func (r *pluginRelay) Exchange(ctx context.Context, key string, blob []byte) (map[uint32][]byte, error) {
	const op = "Relay.Exchange"
	if len(blob) > MaxRelayBlob {
		return nil, fmt.Errorf("%s: blob of %d bytes under key %q, limit %d", op, len(blob), key, MaxRelayBlob)
	}
	resp, err := r.rpc.Exchange(ctx, &pb.RelayExchangeRequest{Key: key, Blob: blob})
	if err != nil {
		return nil, callError(ctx, op, err)
	}
	out := make(map[uint32][]byte, len(resp.GetEntries()))
	for _, e := range resp.GetEntries() {
		if _, dup := out[e.GetRank()]; dup {
			return nil, invalidResponse(op, fmt.Errorf("rank %d appears twice under key %q", e.GetRank(), key))
		}
		out[e.GetRank()] = e.GetBlob()
	}
	return out, nil
}

// pluginRelayDialer dials the host's relay, once: the host serves it on
// one broker id for the plugin's life.
type pluginRelayDialer struct {
	broker *goplugin.GRPCBroker
	mu     sync.Mutex
	id     uint32
	relay  Relay
}

func (d *pluginRelayDialer) dial(id uint32) (Relay, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay != nil {
		if d.id != id {
			return nil, fmt.Errorf("the host moved its relay from broker id %d to %d", d.id, id)
		}
		return d.relay, nil
	}
	if d.broker == nil {
		return nil, fmt.Errorf("the host offers a relay (broker id %d) but this server has no go-plugin broker", id)
	}
	conn, err := d.broker.Dial(id)
	if err != nil {
		return nil, fmt.Errorf("dial the host's relay (broker id %d): %w", id, err)
	}
	d.id, d.relay = id, &pluginRelay{rpc: pb.NewRelayClient(conn)}
	return d.relay, nil
}
