package netns

import "testing"

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
