package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
)

// Labels of the keys derived from a run's secret. Keys for other purposes
// (Keys.Derive) live under their own prefix, so no caller-chosen label can
// reproduce a wire key.
const (
	labelHandshake   = "cohort/wire/v1/handshake"
	labelToRank      = "cohort/wire/v1/coordinator-to-rank"
	labelToCoord     = "cohort/wire/v1/rank-to-coordinator"
	labelDerivedBase = "cohort/derive/"
)

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
type Keys struct {
	secret    []byte
	handshake []byte
	toRank    []byte // frames coordinator -> rank
	toCoord   []byte // frames rank -> coordinator
}

// DeriveKeys derives the control protocol's keys from the run's shared
// secret: HMAC-SHA256(secret, label) for a fixed label per purpose. It
// refuses a secret shorter than MinSecretLen bytes.
func DeriveKeys(secret []byte) (Keys, error) {
	if len(secret) < MinSecretLen {
		return Keys{}, fmt.Errorf("wire: secret is %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	s := append([]byte(nil), secret...)
	return Keys{
		secret:    s,
		handshake: hmacSum(s, []byte(labelHandshake)),
		toRank:    hmacSum(s, []byte(labelToRank)),
		toCoord:   hmacSum(s, []byte(labelToCoord)),
	}, nil
}

// Derive returns a 32-byte key for another purpose, named by label (the
// averaging data channel, for instance): HMAC-SHA256(secret,
// "cohort/derive/"+label). Distinct labels give independent keys, none equal
// to a control protocol key. It refuses an empty label and the zero Keys.
func (k Keys) Derive(label string) ([]byte, error) {
	if !k.valid() {
		return nil, errZeroKeys
	}
	if label == "" {
		return nil, errors.New("wire: Derive needs a non-empty label")
	}
	return hmacSum(k.secret, []byte(labelDerivedBase+label)), nil
}

// Format keeps key material out of logs whatever the verb.
func (k Keys) Format(f fmt.State, _ rune) {
	if k.valid() {
		fmt.Fprint(f, "wire.Keys{redacted}")
	} else {
		fmt.Fprint(f, "wire.Keys{}")
	}
}

var errZeroKeys = errors.New("wire: keys not derived (use DeriveKeys)")

func (k Keys) valid() bool { return len(k.secret) != 0 }

// hmacSum returns HMAC-SHA256(key, parts...).
func hmacSum(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}
