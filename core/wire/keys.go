package wire

import (
	"errors"
	"fmt"

	"github.com/cohortdl/cohort/shared/authframe"
)

// The control protocol's key schedule. Keys for other purposes (Keys.Derive)
// live under their own prefix, so no caller-chosen label can reproduce a wire
// key.
var schedule = authframe.Schedule{
	Protocol:  "wire",
	Secret:    "secret",
	MinSecret: MinSecretLen,
	Handshake: "cohort/wire/v1/handshake",
	Frames: [2]string{
		dirToRank:  "cohort/wire/v1/coordinator-to-rank",
		dirToCoord: "cohort/wire/v1/rank-to-coordinator",
	},
	Derived: "cohort/derive/",
}

// AveragingDataKeyLabel is the Keys.Derive label of the key an averager's
// own data channel authenticates with: the rank hands it to its averaging
// plugin, the coordinator to its reduce server. The plugin never sees the
// run secret itself.
const AveragingDataKeyLabel = "averaging data"

// Keys holds the keys derived from a run's secret: one for the handshake and
// one for each frame direction, so a frame reflected back at its sender
// fails. Make one with DeriveKeys; the zero Keys is refused everywhere. A Keys
// is immutable and safe to share between goroutines; printing it never shows
// key material.
type Keys struct{ k authframe.Keys }

// DeriveKeys derives the control protocol's keys from the run's shared
// secret: HMAC-SHA256(secret, label) for a fixed label per purpose. It
// refuses a secret shorter than MinSecretLen bytes.
func DeriveKeys(secret []byte) (Keys, error) {
	k, err := authframe.DeriveKeys(schedule, secret)
	return Keys{k}, err
}

// Derive returns a 32-byte key for another purpose, named by label (the
// averaging data channel, for instance): HMAC-SHA256(secret,
// "cohort/derive/"+label). Distinct labels give independent keys, none equal
// to a control protocol key. It refuses an empty label and the zero Keys.
func (k Keys) Derive(label string) ([]byte, error) {
	if !k.k.Valid() {
		return nil, errZeroKeys
	}
	return k.k.Derive(label)
}

// Format keeps key material out of logs whatever the verb.
func (k Keys) Format(f fmt.State, verb rune) {
	if !k.k.Valid() {
		fmt.Fprint(f, "wire.Keys{}")
		return
	}
	k.k.Format(f, verb)
}

var errZeroKeys = errors.New("wire: keys not derived (use DeriveKeys)")

// connKey is the key for frames flowing in d on the connection that hello
// and the challenge's untagged bytes opened: it binds every frame to
// both sides' nonces, so no frame recorded on another connection verifies.
func connKey(k Keys, d direction, hello, challengeCore []byte) []byte {
	return k.k.ConnKey(int(d), hello, challengeCore)
}
