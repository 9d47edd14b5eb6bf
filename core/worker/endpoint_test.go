package worker

import "testing"

func TestAveragingEndpoint(t *testing.T) {
	cases := []struct{ endpoint, coordinator, want string }{
		{":7001", "10.1.2.3:7000", "10.1.2.3:7001"},
		{":7001", "[fe80::1]:7000", "[fe80::1]:7001"},
		{":7001", "coord.example:7000", "coord.example:7001"},
		{"10.9.9.9:7001", "10.1.2.3:7000", "10.9.9.9:7001"},
		{"/dev/shm/rendezvous/run-1", "10.1.2.3:7000", "/dev/shm/rendezvous/run-1"},
		{":7001", "not an address", ":7001"},
	}
	for _, c := range cases {
		if got := averagingEndpoint(c.endpoint, c.coordinator); got != c.want {
			t.Errorf("averagingEndpoint(%q, %q) = %q, want %q", c.endpoint, c.coordinator, got, c.want)
		}
	}
}
