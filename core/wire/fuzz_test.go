package wire

import (
	"bytes"
	"errors"
	"github.com/cohortdl/cohort/shared/authframe"
	"io"
	"testing"
)

// Fixed keys for the fuzz targets; the seed corpus under testdata/fuzz holds
// valid inputs made with them.
var (
	fuzzHandshakeKey = bytes.Repeat([]byte{0x24}, 32)
	fuzzFrameKey     = bytes.Repeat([]byte{0x42}, 32)
)

const fuzzMaxPayload = 1 << 16

// isSentinel reports whether err wraps one of the wire sentinels: every
// refusal of bytes must.
func isSentinel(err error) bool {
	return isAny(err, authframe.ErrBadMagic, authframe.ErrBadVersion, authframe.ErrUnknownKind, authframe.ErrTooLarge, authframe.ErrTruncated, authframe.ErrBadTag)
}

func FuzzDecodeHello(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b, fuzzHandshakeKey)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("refusal wraps no sentinel: %v", err)
			}
			return
		}
		if re := encodeHello(h, nonce(b[16:32]), fuzzHandshakeKey); !bytes.Equal(re[:], b) {
			t.Fatalf("accepted % x, which re-encodes to % x", b, re)
		}
	})
}

func FuzzDecodeChallenge(f *testing.F) {
	f.Fuzz(func(t *testing.T, ch, hello []byte) {
		err := verifyChallenge(ch, hello, fuzzHandshakeKey)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("refusal wraps no sentinel: %v", err)
			}
			return
		}
		if want := encodeChallenge(hello, nonce(ch[8:24]), fuzzHandshakeKey); !bytes.Equal(want[:], ch) {
			t.Fatalf("accepted challenge % x for hello % x; the challenge for it is % x", ch, hello, want)
		}
	})
}

// FuzzDecodeSeal checks proofs and acks (which by the flag) against an
// arbitrary handshake so far.
func FuzzDecodeSeal(f *testing.F) {
	f.Fuzz(func(t *testing.T, isAck bool, b, hello, ch []byte) {
		magic, what := ProofMagic, "proof"
		if isAck {
			magic, what = AckMagic, "ack"
		}
		err := verifySeal(b, magic, what, fuzzHandshakeKey, hello, ch)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("refusal wraps no sentinel: %v", err)
			}
			return
		}
		if want := encodeSeal(magic, fuzzHandshakeKey, hello, ch); !bytes.Equal(want[:], b) {
			t.Fatalf("accepted %s % x; the %s for this handshake is % x", what, b, what, want)
		}
	})
}

// FuzzReadFrame feeds arbitrary bytes to a frame reader (either direction)
// until it stops. Nothing may panic; every frame it returns must re-encode,
// at its sequence number, to exactly the bytes it consumed, and decode
// without panicking.
func FuzzReadFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, toRankDir bool, data []byte) {
		dir := dirToCoord
		if toRankDir {
			dir = dirToRank
		}
		r := &frameReader{mac: authframe.NewMAC(fuzzFrameKey), dir: dir, max: fuzzMaxPayload}
		w := &frameWriter{mac: authframe.NewMAC(fuzzFrameKey)}
		src := bytes.NewReader(data)
		for {
			start := len(data) - src.Len()
			kind, payload, err := r.readFrame(src)
			if err != nil {
				if !errors.Is(err, io.EOF) && !isSentinel(err) {
					t.Fatalf("refusal wraps no sentinel: %v", err)
				}
				return
			}
			consumed := data[start : len(data)-src.Len()]
			if re := w.appendFrame(nil, kind, payload); !bytes.Equal(re, consumed) {
				t.Fatalf("frame %d: read % x, which re-encodes to % x", w.mac.Seq()-1, consumed, re)
			}
			_, _ = Decode(kind, payload)
		}
	})
}
