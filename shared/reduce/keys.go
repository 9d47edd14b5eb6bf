package reduce

import (
	"crypto/sha256"
	"fmt"

	"github.com/cohortdl/cohort/shared/authframe"
)

// The data channel's key schedule; the labels are distinct from the control
// protocol's, so one key never serves both.
var schedule = authframe.Schedule{
	Protocol:  "reduce",
	Secret:    "data key",
	MinSecret: MinKeyLen,
	Handshake: "cohort/reduce/v1/handshake",
	Frames: [2]string{
		ToServer: "cohort/reduce/v1/rank-to-server",
		ToRank:   "cohort/reduce/v1/server-to-rank",
	},
}

// Keys are the data channel's keys, derived from the data key the core hands
// the averager (AveragerConfig.DataKey) and the reduce server: one for the
// handshake and one per frame direction, so a frame reflected back at its
// sender fails. The zero Keys is refused everywhere. A Keys is immutable and
// never prints key material.
type Keys struct{ k authframe.Keys }

// DeriveKeys derives the channel's keys: HMAC-SHA256(dataKey, label) for a
// fixed label per purpose. It refuses a key shorter than MinKeyLen bytes.
func DeriveKeys(dataKey []byte) (Keys, error) {
	k, err := authframe.DeriveKeys(schedule, dataKey)
	return Keys{k}, err
}

// Format keeps key material out of logs whatever the verb.
func (k Keys) Format(f fmt.State, verb rune) {
	if !k.k.Valid() {
		fmt.Fprint(f, "reduce.Keys{}")
		return
	}
	k.k.Format(f, verb)
}

// connKey binds direction d's key to one handshake: the hello and the
// challenge's first 24 bytes, whose nonces make every connection's keys
// unique.
func (k Keys) connKey(d Dir, hello, challengeCore []byte) []byte {
	return k.k.ConnKey(int(d), hello, challengeCore)
}

// RunDigest names a run on the wire: the first 16 bytes of
// SHA-256("cohort/reduce/run/" + runID).
func RunDigest(runID string) [16]byte {
	s := sha256.Sum256([]byte("cohort/reduce/run/" + runID))
	var d [16]byte
	copy(d[:], s[:16])
	return d
}
