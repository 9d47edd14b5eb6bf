package reduce

// Frame kinds: which messages exist and which way each flows. A reader
// refuses any other kind before reading its payload.

import "fmt"

// Kind is a frame's type. Kinds below 0x40 flow rank to server, the others
// server to rank.
type Kind uint16

// Rank -> server.
const (
	KindJoin       Kind = 0x01 // Join: the rank's arena, once, first
	KindAnnounce   Kind = 0x02 // Announce: the rank enters a round
	KindFolded     Kind = 0x03 // RoundRef: the rank's part of its host's fold is done (averaging-cpu's leaders fold in the ring)
	KindReceived   Kind = 0x06 // RoundRef: the leader holds the consensus
	KindDone       Kind = 0x07 // Done: the rank's part of the apply is done, with its sums
	KindAbort      Kind = 0x08 // Abort: the rank abandons a round
	KindSession    Kind = 0x09 // Session: a new membership
	KindBye        Kind = 0x0A // empty: clean goodbye
	KindPingServer Kind = 0x3F // empty: keepalive
)

// Server -> rank.
const (
	KindTopology Kind = 0x41 // Topology: who shares the rank's host
	KindPlan     Kind = 0x42 // Plan: the round's weights and roles
	KindSend     Kind = 0x43 // RoundRef: every rank of the host folded (a leader may take Received)
	KindApply    Kind = 0x45 // RoundRef: the host's consensus is ready (averaging-cpu's leader applied it already)
	KindResult   Kind = 0x46 // Result: the rank's divergence figures
	KindFail     Kind = 0x47 // Fail: the round failed
	KindPingRank Kind = 0x7F // empty: keepalive
)

// Dir is the direction kind flows in.
func (k Kind) Dir() Dir {
	if k < 0x40 {
		return ToServer
	}
	return ToRank
}

// Known reports whether k is a kind of this protocol version.
func (k Kind) Known() bool {
	switch k {
	case KindJoin, KindAnnounce, KindFolded, KindReceived, KindDone,
		KindAbort, KindSession, KindBye, KindPingServer,
		KindTopology, KindPlan, KindSend, KindApply, KindResult, KindFail, KindPingRank:
		return true
	}
	return false
}

func (k Kind) String() string {
	names := map[Kind]string{
		KindJoin: "join", KindAnnounce: "announce", KindFolded: "folded",
		KindReceived: "received", KindDone: "done", KindAbort: "abort",
		KindSession: "session", KindBye: "bye", KindPingServer: "ping", KindTopology: "topology",
		KindPlan: "plan", KindSend: "send", KindApply: "apply",
		KindResult: "result", KindFail: "fail", KindPingRank: "ping",
	}
	if n, ok := names[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(0x%04x)", uint16(k))
}
