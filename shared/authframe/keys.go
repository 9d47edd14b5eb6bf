package authframe

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
)

// A Schedule names one protocol's keys. Every label must be distinct from
// every other protocol's, so that one secret never yields the same key for
// two protocols or two purposes.
type Schedule struct {
	// Protocol names the protocol in errors and in a formatted Keys
	// ("wire" prints as wire.Keys{redacted}).
	Protocol string
	// Secret names what the keys derive from, in errors ("secret", "data
	// key").
	Secret string
	// MinSecret is the shortest secret DeriveKeys accepts.
	MinSecret int
	// Handshake labels the key that tags hellos and acks.
	Handshake string
	// Frames label the keys of frames flowing in direction 0 and in
	// direction 1; each protocol says which way is which.
	Frames [2]string
	// Derived prefixes the labels of Keys.Derive; empty when the protocol
	// hands out no keys for other purposes.
	Derived string
}

// Keys holds the keys one Schedule derives from a secret. The zero Keys is
// invalid (Valid reports false) and the protocols refuse it. A Keys is
// immutable and safe to share between goroutines; printing it never shows
// key material.
type Keys struct {
	protocol  string
	derived   string
	secret    []byte // kept only when the schedule derives other keys
	handshake []byte
	frames    [2][]byte
}

// DeriveKeys derives s's keys from secret: HMAC-SHA256(secret, label) for
// each label. It refuses a secret shorter than s.MinSecret bytes and keeps
// no reference to the caller's buffer.
func DeriveKeys(s Schedule, secret []byte) (Keys, error) {
	if len(secret) < s.MinSecret {
		return Keys{}, fmt.Errorf("%s: %s is %d bytes, want at least %d", s.Protocol, s.Secret, len(secret), s.MinSecret)
	}
	k := Keys{
		protocol:  s.Protocol,
		derived:   s.Derived,
		handshake: Sum(secret, []byte(s.Handshake)),
		frames:    [2][]byte{Sum(secret, []byte(s.Frames[0])), Sum(secret, []byte(s.Frames[1]))},
	}
	if s.Derived != "" {
		k.secret = append([]byte(nil), secret...)
	}
	return k, nil
}

// Valid reports whether k came from DeriveKeys.
func (k Keys) Valid() bool { return len(k.handshake) != 0 }

// Handshake is the key that tags hellos and acks.
func (k Keys) Handshake() []byte { return k.handshake }

// FrameKey is the key of frames flowing in direction d (0 or 1), before it
// is bound to a connection.
func (k Keys) FrameKey(d int) []byte { return k.frames[d] }

// ConnKey is the key of frames flowing in direction d on one connection:
// HMAC-SHA256(FrameKey(d), binding...), where binding is the handshake bytes
// that opened the connection. Every frame is thereby bound to its
// connection, so one spliced in from another fails.
func (k Keys) ConnKey(d int, binding ...[]byte) []byte { return Sum(k.frames[d], binding...) }

// Derive returns a 32-byte key for another purpose, named by label:
// HMAC-SHA256(secret, Derived+label). Distinct labels give independent keys,
// none equal to a protocol key as long as Derived is a prefix of no
// protocol label. It refuses an empty label, the zero Keys, and Keys whose
// schedule derives no other keys.
func (k Keys) Derive(label string) ([]byte, error) {
	switch {
	case !k.Valid():
		return nil, errors.New("keys not derived (use DeriveKeys)")
	case k.derived == "":
		return nil, fmt.Errorf("%s: keys derive no keys for other purposes", k.protocol)
	case label == "":
		return nil, fmt.Errorf("%s: Derive needs a non-empty label", k.protocol)
	}
	return Sum(k.secret, []byte(k.derived+label)), nil
}

// Format keeps key material out of logs whatever the verb.
func (k Keys) Format(f fmt.State, _ rune) {
	if k.Valid() {
		fmt.Fprintf(f, "%s.Keys{redacted}", k.protocol)
	} else {
		fmt.Fprint(f, "authframe.Keys{}")
	}
}

// Sum returns HMAC-SHA256(key, parts...).
func Sum(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// Tag returns the first TagSize bytes of HMAC-SHA256(key, parts...): the tag
// of a hello or an ack.
func Tag(key []byte, parts ...[]byte) []byte { return Sum(key, parts...)[:TagSize] }

// TagOK reports, in constant time, whether tag is Tag(key, parts...).
func TagOK(key, tag []byte, parts ...[]byte) bool { return hmac.Equal(Tag(key, parts...), tag) }
