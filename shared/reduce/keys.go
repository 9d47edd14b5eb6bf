package reduce

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
)

// Labels of the keys derived from a data key.
const (
	labelHandshake = "cohort/reduce/v1/handshake"
	labelUp        = "cohort/reduce/v1/rank-to-server"
	labelDown      = "cohort/reduce/v1/server-to-rank"
)

// Keys are the data channel's keys, derived from the data key the core hands
// the averager (AveragerConfig.DataKey) and the reduce server: one for the
// handshake and one per frame direction, so a frame reflected back at its
// sender fails. The zero Keys is refused everywhere. A Keys is immutable and
// never prints key material.
type Keys struct {
	hs, up, down []byte
}

// DeriveKeys derives the channel's keys: HMAC-SHA256(dataKey, label) for a
// fixed label per purpose. It refuses a key shorter than MinKeyLen bytes.
func DeriveKeys(dataKey []byte) (Keys, error) {
	if len(dataKey) < MinKeyLen {
		return Keys{}, fmt.Errorf("reduce: data key is %d bytes, want at least %d", len(dataKey), MinKeyLen)
	}
	return Keys{
		hs:   hmacSum(dataKey, []byte(labelHandshake)),
		up:   hmacSum(dataKey, []byte(labelUp)),
		down: hmacSum(dataKey, []byte(labelDown)),
	}, nil
}

// Format keeps key material out of logs whatever the verb.
func (k Keys) Format(f fmt.State, _ rune) {
	if k.valid() {
		fmt.Fprint(f, "reduce.Keys{redacted}")
	} else {
		fmt.Fprint(f, "reduce.Keys{}")
	}
}

func (k Keys) valid() bool { return len(k.hs) != 0 }

// dirKey is the key of frames flowing in d.
func (k Keys) dirKey(d Dir) []byte {
	if d == ToServer {
		return k.up
	}
	return k.down
}

// connKey binds direction d's key to one handshake.
func (k Keys) connKey(d Dir, hello, ackCore []byte) []byte {
	return hmacSum(k.dirKey(d), hello, ackCore)
}

func hmacSum(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// RunDigest names a run on the wire: the first 16 bytes of
// SHA-256("cohort/reduce/run/" + runID).
func RunDigest(runID string) [16]byte {
	s := sha256.Sum256([]byte("cohort/reduce/run/" + runID))
	var d [16]byte
	copy(d[:], s[:16])
	return d
}
