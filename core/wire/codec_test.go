package wire

import (
	"errors"
	"strings"
	"testing"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"google.golang.org/protobuf/proto"
)

// Every FrameKind in wire.proto has a message type, both ways, and
// sampleMessages holds one of each (so the round-trip tests cover them all).
func TestCodecCoversEveryKind(t *testing.T) {
	samples := map[wirepb.FrameKind]proto.Message{}
	for _, m := range sampleMessages() {
		k := kindOf(m)
		if _, dup := samples[k]; dup {
			t.Errorf("two samples of kind %s", k)
		}
		samples[k] = m
	}
	values := wirepb.FrameKind(0).Descriptor().Values()
	for i := 0; i < values.Len(); i++ {
		kind := wirepb.FrameKind(values.Get(i).Number())
		msg := newMessage(kind)
		if kind == wirepb.FrameKind_FRAME_KIND_UNSPECIFIED {
			if msg != nil {
				t.Errorf("UNSPECIFIED maps to %T", msg)
			}
			continue
		}
		if msg == nil {
			t.Errorf("%s has no message type", kind)
			continue
		}
		if got := kindOf(msg); got != kind {
			t.Errorf("%s -> %T -> %s", kind, msg, got)
		}
		sample, ok := samples[kind]
		if !ok {
			t.Errorf("no sample message of kind %s", kind)
			continue
		}
		gotKind, payload, err := Encode(sample)
		if err != nil || gotKind != kind {
			t.Errorf("Encode(%T) = %s, %v; want %s", sample, gotKind, err, kind)
			continue
		}
		back, err := Decode(kind, payload)
		if err != nil || !proto.Equal(back, sample) {
			t.Errorf("Decode(%s): %v, equal=%v", kind, err, proto.Equal(back, sample))
		}
	}
	if len(samples) != values.Len()-1 {
		t.Errorf("%d samples for %d kinds", len(samples), values.Len()-1)
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  proto.Message
	}{
		{"nil", nil},
		{"typed nil", (*wirepb.Heartbeat)(nil)},
		{"not a frame message", &wirepb.EpochPlan{Epoch: 1}},
		{"nested message", &wirepb.GpuSample{}},
	} {
		if _, _, err := Encode(tc.msg); err == nil {
			t.Errorf("%s: Encode accepted", tc.name)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, kind := range []wirepb.FrameKind{0, 20, 63, 79, 999, -1} {
		if _, err := Decode(kind, nil); !errors.Is(err, authframe.ErrUnknownKind) {
			t.Errorf("Decode(kind %d): %v, want authframe.ErrUnknownKind", kind, err)
		}
	}
	// A truncated varint does not parse; the error names the kind.
	_, err := Decode(wirepb.FrameKind_FRAME_KIND_START_EPOCH, []byte{0x0a, 0x05, 0x08})
	if err == nil || !strings.Contains(err.Error(), "FRAME_KIND_START_EPOCH") {
		t.Errorf("Decode(garbage) = %v, want an error naming FRAME_KIND_START_EPOCH", err)
	}
}
