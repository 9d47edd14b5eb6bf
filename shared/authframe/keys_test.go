package authframe

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// Two schedules shaped like cohort's two protocols, with their own labels.
var (
	ctlSchedule = Schedule{Protocol: "ctl", Secret: "secret", MinSecret: 16, Handshake: "t/ctl/hs",
		Frames: [2]string{"t/ctl/down", "t/ctl/up"}, Derived: "t/derive/"}
	dataSchedule = Schedule{Protocol: "data", Secret: "data key", MinSecret: 16, Handshake: "t/data/hs",
		Frames: [2]string{"t/data/up", "t/data/down"}}
	secretA = []byte("a secret of at least sixteen bytes")
	secretB = []byte("another secret, also long enough")
)

func mustDerive(t testing.TB, s Schedule, secret []byte) Keys {
	t.Helper()
	k, err := DeriveKeys(s, secret)
	if err != nil {
		t.Fatalf("DeriveKeys(%s): %v", s.Protocol, err)
	}
	return k
}

func TestDeriveKeysRefusesShortSecrets(t *testing.T) {
	for _, tc := range []struct {
		n       int
		wantErr bool
	}{{0, true}, {1, true}, {15, true}, {16, false}, {64, false}} {
		_, err := DeriveKeys(dataSchedule, make([]byte, tc.n))
		if (err != nil) != tc.wantErr {
			t.Errorf("DeriveKeys(%d bytes): err %v, want error %v", tc.n, err, tc.wantErr)
		}
		if err != nil && (!strings.Contains(err.Error(), "data key is "+fmt.Sprint(tc.n)+" bytes") || !strings.HasPrefix(err.Error(), "data: ")) {
			t.Errorf("error %q does not name the protocol, the secret and its length", err)
		}
	}
}

// Every key of every schedule and secret is distinct: a key of one purpose,
// direction, protocol or run never verifies another's bytes.
func TestKeysSeparatePurposes(t *testing.T) {
	named := map[string][]byte{}
	for _, s := range []Schedule{ctlSchedule, dataSchedule} {
		for _, sec := range [][]byte{secretA, secretB} {
			k := mustDerive(t, s, sec)
			again := mustDerive(t, s, sec)
			name := s.Protocol + "/" + string(sec[:3])
			named[name+".handshake"] = k.Handshake()
			named[name+".frames0"] = k.FrameKey(0)
			named[name+".frames1"] = k.FrameKey(1)
			named[name+".conn0"] = k.ConnKey(0, []byte("hello"))
			named[name+".conn0other"] = k.ConnKey(0, []byte("hello2"))
			named[name+".conn1"] = k.ConnKey(1, []byte("hello"))
			if !bytes.Equal(k.Handshake(), again.Handshake()) || !bytes.Equal(k.ConnKey(1, []byte("h")), again.ConnKey(1, []byte("h"))) {
				t.Errorf("%s: DeriveKeys is not deterministic", name)
			}
		}
	}
	d, err := mustDerive(t, ctlSchedule, secretA).Derive("x")
	if err != nil {
		t.Fatal(err)
	}
	named["derived"] = d
	seen := map[string]string{}
	for name, key := range named {
		if len(key) != 32 {
			t.Errorf("%s is %d bytes, want 32", name, len(key))
		}
		if prev, dup := seen[string(key)]; dup {
			t.Errorf("%s equals %s", name, prev)
		}
		seen[string(key)] = name
	}
}

func TestDerive(t *testing.T) {
	buf := append([]byte(nil), secretA...)
	k := mustDerive(t, ctlSchedule, buf)
	a, err := k.Derive("averaging data")
	if err != nil {
		t.Fatal(err)
	}
	buf[0] ^= 1
	if a2, _ := k.Derive("averaging data"); !bytes.Equal(a, a2) {
		t.Error("Derive changed after the caller modified its secret buffer")
	}
	if want := Sum(secretA, []byte("t/derive/averaging data")); !bytes.Equal(a, want) {
		t.Errorf("Derive = %x, want HMAC(secret, prefix+label) = %x", a, want)
	}
	for _, tc := range []struct {
		name  string
		keys  Keys
		label string
		want  string // in the error
	}{
		{"empty label", k, "", "non-empty label"},
		{"zero Keys", Keys{}, "x", "not derived"},
		{"schedule without derived keys", mustDerive(t, dataSchedule, secretA), "x", "no keys for other purposes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if key, err := tc.keys.Derive(tc.label); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Derive(%q) = %x, %v; want an error mentioning %q", tc.label, key, err, tc.want)
			}
		})
	}
}

func TestKeysFormatRedacts(t *testing.T) {
	k := mustDerive(t, ctlSchedule, secretA)
	out := fmt.Sprintf("%v %+v %#v %s %x %q", k, k, k, k, k, k)
	if !strings.HasPrefix(out, "ctl.Keys{redacted} ") {
		t.Errorf("formatted Keys %q does not name its protocol", out)
	}
	for _, key := range [][]byte{secretA, k.Handshake(), k.FrameKey(0), k.FrameKey(1)} {
		if strings.Contains(out, string(key)) || strings.Contains(out, hex.EncodeToString(key[:8])) ||
			strings.Contains(out, fmt.Sprint(key[:4])[1:8]) {
			t.Fatalf("formatted Keys leaks key material: %s", out)
		}
	}
	if z := fmt.Sprint(Keys{}); z != "authframe.Keys{}" || (Keys{}).Valid() {
		t.Errorf("zero Keys prints %q (valid %v)", z, Keys{}.Valid())
	}
}

func TestTag(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	tag := Tag(key, []byte("hel"), []byte("lo"))
	if len(tag) != TagSize || !bytes.Equal(tag, Sum(key, []byte("hello"))[:TagSize]) {
		t.Fatalf("Tag = %x, want the first %d bytes of HMAC(key, parts joined)", tag, TagSize)
	}
	flipped := func(b []byte, i int) []byte { c := append([]byte(nil), b...); c[i] ^= 1; return c }
	for _, tc := range []struct {
		name string
		key  []byte
		tag  []byte
		msg  string
		want bool
	}{
		{"good", key, tag, "hello", true},
		{"other message", key, tag, "hellO", false},
		{"other key", flipped(key, 0), tag, "hello", false},
		{"flipped tag bit", key, flipped(tag, 7), "hello", false},
		{"short tag", key, tag[:TagSize-1], "hello", false},
		{"full HMAC instead of tag", key, Sum(key, []byte("hello")), "hello", false},
		{"no tag", key, nil, "hello", false},
	} {
		if got := TagOK(tc.key, tc.tag, []byte(tc.msg)); got != tc.want {
			t.Errorf("%s: TagOK = %v, want %v", tc.name, got, tc.want)
		}
	}
}
