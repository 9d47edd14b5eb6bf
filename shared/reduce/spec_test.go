package reduce

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/cohortdl/cohort/shared/authframe"
)

// The handshake and frame bytes follow doc.go, with every key and tag
// computed here from the data key and the labels alone, by plain HMAC
// (authframe.Sum, whose own tests check it against crypto/hmac).
func TestWireBytesFollowTheSpec(t *testing.T) {
	sum := authframe.Sum
	le := binary.LittleEndian
	dataKey := []byte("fuzzing data key, thirty-two by.") // fuzzKeys' key
	hk := sum(dataKey, []byte("cohort/reduce/v1/handshake"))
	if want := sum(hk, fuzzHelloB[:136])[:8]; !bytes.Equal(fuzzHelloB[136:], want) {
		t.Fatalf("hello tag % x, want % x", fuzzHelloB[136:], want)
	}
	connKey := sum(sum(dataKey, []byte("cohort/reduce/v1/rank-to-server")), fuzzHelloB[:], fuzzChallengeCore)
	payloads := [][]byte{Announce{Round: 1, Steps: 2, Weight: 2}.Encode(), RoundRef{Round: 1}.Encode()}
	stream := signedStream([]any{KindAnnounce, payloads[0]}, []any{KindFolded, payloads[1]})
	for seq, kind := range []Kind{KindAnnounce, KindFolded} {
		p := payloads[seq]
		hdr := le.AppendUint32(nil, FrameMagic)
		hdr = le.AppendUint16(hdr, uint16(kind))
		hdr = le.AppendUint16(hdr, 0)
		hdr = le.AppendUint64(hdr, uint64(len(p)))
		want := append(append(hdr, p...), sum(connKey, le.AppendUint64(nil, uint64(seq)), hdr, p)[:8]...)
		if len(stream) < len(want) || !bytes.Equal(stream[:len(want)], want) {
			t.Fatalf("frame %d\n got % x\nwant % x", seq, stream[:min(len(stream), len(want))], want)
		}
		stream = stream[len(want):]
	}
	if len(stream) != 0 {
		t.Fatalf("%d bytes after the frames", len(stream))
	}
}
