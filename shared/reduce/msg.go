package reduce

// The messages of the data channel, as Go values; codec.go has their bytes.

// Bounds of variable-length fields.
const (
	MaxPath    = 4096
	MaxReason  = 1024
	MaxMembers = 1 << 16
	MaxAddr    = 256
)

// Join is a rank's first frame: where its arena lives, so ranks of its host
// can map it.
type Join struct {
	ArenaPath string
	// Dev and Ino identify the arena file, so a peer that opens the path
	// can tell it reached the same file.
	Dev, Ino uint64
	PID      uint32
	// RingPort is where the rank listens for ring links should it lead
	// its host (averaging-cpu's internal/ring); the server pairs it with
	// the address it sees the rank connect from.
	RingPort uint16
}

// Announce enters a round.
type Announce struct {
	Round uint64
	// Session is the membership generation the rank runs under.
	Session uint64
	Steps   uint64
	// Weight is gamma_mass(Steps): 0 exactly when Steps is 0.
	Weight    float64
	Broadcast bool
	// Root is the broadcast root's global rank.
	Root uint32
	// OuterSteps and OuterID fingerprint the rank's outer optimizer state;
	// when ranks disagree the server tells them all to reseed it.
	OuterSteps uint64
	OuterID    [8]byte
}

// RoundRef names a round.
type RoundRef struct{ Round uint64 }

// Partial is one rank's share of the divergence sums over a slice.
type Partial struct {
	Rank        uint32
	Diff2, Pre2 float64
}

// Done reports a participant's slice applied, with its partial sums.
type Done struct {
	Round uint64
	Post2 float64
	Parts []Partial
}

// Abort abandons a round.
type Abort struct {
	Round  uint64
	Reason string
}

// Session announces a new membership: ranks outside Members are dead.
type Session struct {
	Generation uint64
	Members    []uint32
}

// Peer is a rank of the receiver's host.
type Peer struct {
	Rank     uint32
	Dev, Ino uint64
	Path     string
}

// Topology tells a rank who shares its host: Peers in rank order, the first
// being the host's leader.
type Topology struct {
	Generation uint64
	Hosts      uint32
	Host       uint32
	Peers      []Peer
	// Leaders are the ring addresses (host:port) of every host's leader,
	// in host order: a leader's ring successor is the next one.
	Leaders []string
}

// PlanPart is one participant of the receiver's host in a round.
type PlanPart struct {
	Rank   uint32
	Weight float64
}

// Plan starts a round's work.
type Plan struct {
	Round, Topology uint64
	// Realized is false when nobody trained: every rank keeps its values.
	Realized  bool
	Broadcast bool
	// Seed tells the ranks to restart their outer optimizer from this
	// round's consensus (their states disagreed).
	Seed  bool
	Root  uint32
	Hosts uint32
	// TotalWeight and TotalMovers are the cohort's sums.
	TotalWeight, TotalMovers float64
	// Parts are the host's participants, in slice order.
	Parts []PlanPart
}

// Result is the rank's divergence sums over the whole round.
type Result struct {
	Round              uint64
	Diff2, Pre2, Post2 float64
	// Bytes counts the data the host leaders' ring moved over TCP, all hosts.
	Bytes uint64
}

// Fail ends a round with an error.
type Fail struct {
	Round  uint64
	Reason string
}
