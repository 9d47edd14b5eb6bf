package record

import "github.com/cohortdl/cohort/core/coordinator/dispatch"

// ComebacksDir holds, in the run's out directory, one ComebackRecord per
// time a coordinator came back and took the ranks' kept models
// (comeback-<round>.json, by the round that started the cohort again).
const ComebacksDir = "comebacks"

// ComebackRecord is how a coordinator that came back started the cohort:
// from which consensus, by which first round, and what each rank's kept
// work became. Reached are the spans its first round took into the model
// (counted as trained); Retrained the spans of kept models it replaced,
// which are in the remaining work again and trained a second time. Mode
// "continue" has no first round: the ranks finished the window they were
// training, and Round, the window's round, took every rank's kept work.
type ComebackRecord struct {
	// Consensus is the round whose consensus the holders kept; Round the
	// first round of the coordinator that came back.
	Consensus uint64                     `json:"consensus"`
	Round     uint64                     `json:"round"`
	Mode      string                     `json:"mode"` // "continue", "average" or "broadcast"
	Root      uint32                     `json:"root"`
	Holders   []uint32                   `json:"holders"`
	Reached   map[uint32][]dispatch.Span `json:"reached"`
	Retrained map[uint32][]dispatch.Span `json:"retrained"`
}
