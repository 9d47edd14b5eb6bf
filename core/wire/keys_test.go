package wire

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"testing"
)

func TestDeriveKeysRefusesShortSecrets(t *testing.T) {
	for _, n := range []int{0, 1, MinSecretLen - 1} {
		if _, err := DeriveKeys(make([]byte, n)); err == nil {
			t.Errorf("DeriveKeys(%d bytes) accepted", n)
		}
	}
	if _, err := DeriveKeys(make([]byte, MinSecretLen)); err != nil {
		t.Errorf("DeriveKeys(%d bytes): %v", MinSecretLen, err)
	}
}

func TestDerive(t *testing.T) {
	secret := append([]byte(nil), testSecret...)
	k := mustKeys(t, secret)
	a, err := k.Derive("averager/data")
	if err != nil {
		t.Fatal(err)
	}
	secret[0] ^= 1 // the caller's buffer is not the Keys' own
	a2, _ := k.Derive("averager/data")
	b, _ := k.Derive("averager/data2")
	c, _ := mustKeys(t, otherSecret).Derive("averager/data")
	if !bytes.Equal(a, a2) {
		t.Error("Derive changed after the caller modified its secret buffer, or is not deterministic")
	}
	if bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Error("Derive ignores its label or the secret")
	}
	// No label reaches the wire keys.
	for _, label := range []string{schedule.Handshake, schedule.Frames[0], schedule.Frames[1], "../wire/v1/handshake"} {
		d, _ := k.Derive(label)
		if bytes.Equal(d, k.k.Handshake()) || bytes.Equal(d, k.k.FrameKey(0)) || bytes.Equal(d, k.k.FrameKey(1)) {
			t.Errorf("Derive(%q) reproduces a wire key", label)
		}
	}
	if _, err := k.Derive(""); err == nil {
		t.Error("Derive(\"\") accepted")
	}
	if _, err := (Keys{}).Derive("x"); err == nil {
		t.Error("zero Keys derived a key")
	}
}

func TestKeysFormatRedacts(t *testing.T) {
	k := mustKeys(t, testSecret)
	out := fmt.Sprintf("%v %+v %#v %s %x %q", k, k, k, k, k, k)
	if !strings.HasPrefix(out, "wire.Keys{redacted} ") {
		t.Errorf("formatted Keys %q does not name the wire protocol", out)
	}
	if z := fmt.Sprint(Keys{}); z != "wire.Keys{}" {
		t.Errorf("zero Keys prints %q, want wire.Keys{}", z)
	}
	for _, secret := range [][]byte{testSecret, k.k.Handshake(), k.k.FrameKey(0), k.k.FrameKey(1)} {
		if strings.Contains(out, string(secret)) || strings.Contains(out, hex.EncodeToString(secret[:8])) ||
			strings.Contains(out, fmt.Sprint(secret[:4])[1:8]) {
			t.Fatalf("formatted Keys leaks key material: %s", out)
		}
	}
}

func TestZeroKeysRefused(t *testing.T) {
	cn, sn := net.Pipe()
	if _, err := ClientHandshake(context.Background(), cn, Keys{}, Hello{Rank: 0, World: 1}); err == nil {
		t.Error("ClientHandshake accepted zero Keys")
	}
	if _, _, err := ServerHandshake(context.Background(), sn, Keys{}, nil); err == nil {
		t.Error("ServerHandshake accepted zero Keys")
	}
}
