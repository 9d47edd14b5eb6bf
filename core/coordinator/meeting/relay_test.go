package meeting

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/shared/plugin"
)

// relayStep is one post (or death) and what the hub must send for it.
type relayStep struct {
	rank    uint32
	key     string
	blob    []byte
	gone    bool // the rank dies instead of posting
	formed  bool // the cohort has formed (deaths fail, posts do not replace)
	live    []uint32
	wantTo  []uint32 // ranks sent a result, in order
	wantErr string   // "" for a completed exchange
}

func TestRelayHub(t *testing.T) {
	all := []uint32{0, 1, 2}
	big := make([]byte, plugin.MaxRelayBlob+1)
	full := make([]byte, plugin.MaxRelayBlob)
	four := []uint32{0, 1, 2, 3}
	cases := []struct {
		name  string
		steps []relayStep
	}{
		{name: "completes once every live rank posted", steps: []relayStep{
			{rank: 1, key: "k", blob: []byte("b1"), live: all, formed: true},
			{rank: 0, key: "k", blob: []byte("b0"), live: all, formed: true},
			{rank: 2, key: "k", blob: []byte("b2"), live: all, formed: true, wantTo: []uint32{0, 1, 2}},
		}},
		{name: "a dead rank is not waited for", steps: []relayStep{
			{rank: 0, key: "k", blob: []byte("b0"), live: []uint32{0, 2}, formed: true},
			{rank: 2, key: "k", blob: []byte("b2"), live: []uint32{0, 2}, formed: true, wantTo: []uint32{0, 2}},
		}},
		{name: "a death fails the exchanges in flight, and later posts", steps: []relayStep{
			{rank: 0, key: "k", blob: []byte("b0"), live: all, formed: true},
			{rank: 1, key: "k", blob: []byte("b1"), live: all, formed: true},
			{rank: 2, gone: true, formed: true, wantTo: []uint32{0, 1}, wantErr: "rank 2 died"},
			{rank: 1, key: "k", blob: []byte("b1"), live: []uint32{0, 1}, formed: true, wantTo: []uint32{1}, wantErr: "rank 2 died"},
			{rank: 0, key: "next", blob: []byte("n0"), live: []uint32{0, 1}, formed: true},
			{rank: 1, key: "next", blob: []byte("n1"), live: []uint32{0, 1}, formed: true, wantTo: []uint32{0, 1}},
		}},
		{name: "before formation a rank that left takes its post back", steps: []relayStep{
			{rank: 0, key: "k", blob: []byte("b0"), live: all},
			{rank: 1, key: "k", blob: []byte("stale"), live: all},
			{rank: 1, gone: true},
			{rank: 2, key: "k", blob: []byte("b2"), live: all},
			{rank: 1, key: "k", blob: []byte("b1"), live: all, wantTo: []uint32{0, 1, 2}},
		}},
		{name: "a second post is refused after formation", steps: []relayStep{
			{rank: 0, key: "k", blob: []byte("b0"), live: all, formed: true},
			{rank: 0, key: "k", blob: []byte("again"), live: all, formed: true, wantTo: []uint32{0}, wantErr: "posted twice"},
		}},
		{name: "a rank outside the live set is refused", steps: []relayStep{
			{rank: 2, key: "k", blob: []byte("b2"), live: []uint32{0, 1}, formed: true, wantTo: []uint32{2}, wantErr: "not a live rank"},
		}},
		{name: "an oversize blob fails the exchange for every poster", steps: []relayStep{
			{rank: 0, key: "k", blob: []byte("b0"), live: all, formed: true},
			{rank: 1, key: "k", blob: big, live: all, formed: true, wantTo: []uint32{0, 1}, wantErr: "per rank"},
			{rank: 2, key: "k", blob: []byte("b2"), live: all, formed: true, wantTo: []uint32{2}, wantErr: "per rank"},
		}},
		{name: "blobs over the exchange's bound fail it", steps: []relayStep{
			{rank: 0, key: "k", blob: full, live: four, formed: true},
			{rank: 1, key: "k", blob: full, live: four, formed: true},
			{rank: 2, key: "k", blob: full, live: four, formed: true},
			{rank: 3, key: "k", blob: full, live: four, formed: true, wantTo: four, wantErr: "per exchange"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newRelayHub()
			posted := map[string]map[uint32]string{}
			for i, st := range tc.steps {
				var sends []relaySend
				if st.gone {
					sends = h.rankGone(st.rank, "link lost", st.formed)
				} else {
					sends = h.post(st.rank, st.key, st.blob, st.live, !st.formed)
					if posted[st.key] == nil {
						posted[st.key] = map[uint32]string{}
					}
					posted[st.key][st.rank] = string(st.blob)
				}
				var to []uint32
				for _, s := range sends {
					to = append(to, s.rank)
					switch {
					case st.wantErr != "" && !strings.Contains(s.msg.GetError(), st.wantErr):
						t.Errorf("step %d: rank %d got error %q, want one containing %q", i, s.rank, s.msg.GetError(), st.wantErr)
					case st.wantErr == "" && s.msg.GetError() != "":
						t.Errorf("step %d: rank %d got error %q", i, s.rank, s.msg.GetError())
					case st.wantErr == "":
						want := posted[st.key]
						if len(s.msg.GetBlobs()) != len(want) {
							t.Errorf("step %d: %d blobs, want %d", i, len(s.msg.GetBlobs()), len(want))
						}
						for j, b := range s.msg.GetBlobs() {
							if j > 0 && b.GetRank() <= s.msg.GetBlobs()[j-1].GetRank() {
								t.Errorf("step %d: blobs not in rank order", i)
							}
							if string(b.GetBlob()) != want[b.GetRank()] {
								t.Errorf("step %d: rank %d's blob %q, want %q", i, b.GetRank(), b.GetBlob(), want[b.GetRank()])
							}
						}
					}
				}
				if fmt.Sprint(to) != fmt.Sprint(st.wantTo) {
					t.Fatalf("step %d: results sent to %v, want %v", i, to, st.wantTo)
				}
			}
		})
	}
}

func TestRelayHubForgetsOldFailures(t *testing.T) {
	h := newRelayHub()
	for i := range maxFailedKeys + 10 {
		h.fail(fmt.Sprintf("k%d", i), "test")
	}
	if len(h.failed) != maxFailedKeys || len(h.failedOrder) != maxFailedKeys {
		t.Fatalf("%d failed keys remembered (%d in order), want %d", len(h.failed), len(h.failedOrder), maxFailedKeys)
	}
	if _, ok := h.failed["k0"]; ok {
		t.Error("the oldest failure is still remembered")
	}
}
