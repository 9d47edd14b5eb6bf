package meeting

import (
	"fmt"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// relayHub is the coordinator's side of the relay (plugin.Relay): an
// all-gather of small blobs among the live ranks, keyed by the averagers'
// own strings. It holds no goroutine and no lock: the loop owns it and
// sends what it returns.
type relayHub struct {
	pending map[string]*relayExchange
	// failed remembers the keys whose exchange failed, so a rank that
	// posts late is failed at once instead of waiting for ranks that
	// already gave up; the oldest are forgotten past maxFailedKeys.
	failed      map[string]string
	failedOrder []string
}

type relayExchange struct {
	posts map[uint32][]byte
	bytes int
}

// maxFailedKeys bounds the failed-key memory. Exchanges fail only on
// deaths, a handful per run, so this is never reached in practice.
const maxFailedKeys = 4096

func newRelayHub() *relayHub {
	return &relayHub{pending: map[string]*relayExchange{}, failed: map[string]string{}}
}

// relaySend is one RelayResult for one rank.
type relaySend struct {
	rank uint32
	msg  *wirepb.RelayResult
}

// post records rank's blob under key. expected is the ranks the exchange
// waits for, ascending (the live ranks; before formation, the whole
// world), and
// replace lets a rank post again (before formation a rank that left may
// rejoin and redo its setup). It returns the results to send.
func (h *relayHub) post(rank uint32, key string, blob []byte, expected []uint32, replace bool) []relaySend {
	if why, ok := h.failed[key]; ok {
		return []relaySend{{rank, &wirepb.RelayResult{Key: key, Error: why}}}
	}
	if _, ok := slices.BinarySearch(expected, rank); !ok {
		return []relaySend{{rank, &wirepb.RelayResult{Key: key, Error: fmt.Sprintf("rank %d is not a live rank of the cohort", rank)}}}
	}
	ex := h.pending[key]
	if ex == nil {
		ex = &relayExchange{posts: map[uint32][]byte{}}
		h.pending[key] = ex
	}
	if old, dup := ex.posts[rank]; dup {
		if !replace {
			return []relaySend{{rank, &wirepb.RelayResult{Key: key, Error: fmt.Sprintf("rank %d posted twice under this key", rank)}}}
		}
		ex.bytes -= len(old)
	}
	ex.posts[rank] = blob
	ex.bytes += len(blob)
	switch {
	case len(blob) > plugin.MaxRelayBlob:
		return h.fail(key, fmt.Sprintf("rank %d's blob is %d bytes, over the relay's %d per rank", rank, len(blob), plugin.MaxRelayBlob))
	case ex.bytes > plugin.MaxRelayExchange:
		return h.fail(key, fmt.Sprintf("the blobs posted so far come to %d bytes, over the relay's %d per exchange", ex.bytes, plugin.MaxRelayExchange))
	}
	return h.complete(key, expected)
}

// complete sends key's result when every expected rank has posted.
func (h *relayHub) complete(key string, expected []uint32) []relaySend {
	ex := h.pending[key]
	if len(ex.posts) < len(expected) {
		// Not everyone has posted: checking each expected rank on every
		// post would make an exchange among n ranks cost n².
		return nil
	}
	for _, r := range expected {
		if _, ok := ex.posts[r]; !ok {
			return nil
		}
	}
	delete(h.pending, key)
	res := &wirepb.RelayResult{Key: key, Blobs: make([]*wirepb.RelayBlob, 0, len(ex.posts))}
	for _, r := range slices.Sorted(maps.Keys(ex.posts)) {
		res.Blobs = append(res.Blobs, &wirepb.RelayBlob{Rank: r, Blob: ex.posts[r]})
	}
	out := make([]relaySend, 0, len(ex.posts))
	for _, b := range res.Blobs {
		out = append(out, relaySend{b.Rank, res})
	}
	return out
}

// fail ends key's exchange for every rank that posted to it, and for every
// later post.
func (h *relayHub) fail(key, why string) []relaySend {
	var out []relaySend
	if ex := h.pending[key]; ex != nil {
		res := &wirepb.RelayResult{Key: key, Error: why}
		for _, r := range slices.Sorted(maps.Keys(ex.posts)) {
			out = append(out, relaySend{r, res})
		}
		delete(h.pending, key)
	}
	if _, ok := h.failed[key]; !ok {
		h.failed[key] = why
		h.failedOrder = append(h.failedOrder, key)
		if len(h.failedOrder) > maxFailedKeys {
			delete(h.failed, h.failedOrder[0])
			h.failedOrder = h.failedOrder[1:]
		}
	}
	return out
}

// rankGone fails every exchange in flight: a live rank died, so none of
// them can complete as its posters expect. Before formation a rank that
// left only takes its posts back; it may rejoin.
func (h *relayHub) rankGone(rank uint32, reason string, formed bool) []relaySend {
	var out []relaySend
	for _, key := range slices.Sorted(maps.Keys(h.pending)) {
		if !formed {
			if ex := h.pending[key]; ex != nil {
				ex.bytes -= len(ex.posts[rank])
				delete(ex.posts, rank)
			}
			continue
		}
		out = append(out, h.fail(key, fmt.Sprintf("rank %d died before the exchange completed: %s", rank, reason))...)
	}
	return out
}

// failAll fails every exchange in flight with why.
func (h *relayHub) failAll(why string) []relaySend {
	var out []relaySend
	for _, key := range slices.Sorted(maps.Keys(h.pending)) {
		out = append(out, h.fail(key, why)...)
	}
	return out
}

// Outbox is how a Hub sends a rank its frames.
type Outbox interface {
	Send(rank uint32, msg proto.Message)
}

// Hub is a run's side of the meeting: it answers MeetRequest with the
// point of the cohort's meeting kind and runs the relay. It holds no
// goroutine and no lock: the loop owns it.
type Hub struct {
	table *Table
	relay *relayHub
	out   Outbox
	log   hclog.Logger
	kind  string   // the meeting kind the first MeetRequest named
	every []uint32 // 0..world-1, what a relay exchange waits for before formation
}

// NewHub is a run's hub over table's points; it sends through out.
func NewHub(table *Table, out Outbox, log hclog.Logger) *Hub {
	return &Hub{table: table, relay: newRelayHub(), out: out, log: log}
}

// Post takes a rank's part of a relay exchange. Before formation the
// exchange waits for the whole world (a rank still setting up has not
// posted yet); after, for live, the live ranks in ascending order.
func (h *Hub) Post(rank uint32, m *wirepb.RelayPost, live []uint32, forming bool) {
	expected := live
	if forming {
		if len(h.every) == 0 {
			h.every = make([]uint32, h.table.env.World)
			for i := range h.every {
				h.every[i] = uint32(i)
			}
		}
		expected = h.every
	}
	h.send(h.relay.post(rank, m.GetKey(), m.GetBlob(), expected, forming))
}

// Dead takes a rank that died in the formed cohort out of the meeting
// points' later rounds and fails the relay exchanges in flight.
func (h *Hub) Dead(rank uint32, reason string) {
	h.table.MarkDead(rank)
	h.send(h.relay.rankGone(rank, reason, true))
}

// Left takes back the posts of a rank that left before formation: it may
// rejoin and post again.
func (h *Hub) Left(rank uint32) {
	h.relay.rankGone(rank, "", false)
}

// FailAll fails every relay exchange in flight with why.
func (h *Hub) FailAll(why string) {
	h.send(h.relay.failAll(why))
}

func (h *Hub) send(sends []relaySend) {
	for _, s := range sends {
		if s.msg.GetError() != "" {
			h.log.Debug("relay exchange failed", "rank", s.rank, "key", s.msg.GetKey(), "reason", s.msg.GetError())
		}
		h.out.Send(s.rank, s.msg)
	}
}
