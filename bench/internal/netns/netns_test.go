package netns

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestTCRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"1gbit", 1e9, true},
		{"100mbit", 1e8, true},
		{"2.5gbit", 2.5e9, true},
		{"500kbit", 5e5, true},
		{"9600bit", 9600, true},
		{"0mbit", 0, false},
		{"-1gbit", 0, false},
		{"fast", 0, false},
		{"1gbps", 0, false},
		{"", 0, false},
	} {
		got, err := TCRate(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("TCRate(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
}

// A cut link takes the carrier from that host's eth0 alone, and a restored
// one gives it back.
func TestSetLink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the namespace test bed needs root (ip netns)")
	}
	b, err := New("cohort-netnstest-", 75, 3, "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	carriers := func() string {
		var s []string
		for i := range b.Hosts {
			c, err := b.Read(i, "cat", "/sys/class/net/eth0/carrier")
			if err != nil {
				t.Fatal(err)
			}
			s = append(s, c)
		}
		return strings.Join(s, " ")
	}
	for _, c := range []struct {
		host int
		up   bool
		want string
	}{
		{1, false, "1 0 1"},
		{2, false, "1 0 0"},
		{1, true, "1 1 0"},
		{2, true, "1 1 1"},
	} {
		if err := b.SetLink(c.host, c.up); err != nil {
			t.Fatal(err)
		}
		// The carrier follows the peer's state as the kernel handles the
		// change; give it a moment.
		var got string
		for range 50 {
			if got = carriers(); got == c.want {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got != c.want {
			t.Fatalf("host %d up=%v: carriers %q, want %q", c.host, c.up, got, c.want)
		}
	}
}
