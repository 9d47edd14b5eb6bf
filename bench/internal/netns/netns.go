// Package netns is the benchmarks' test bed of hosts on one machine: each
// host a network namespace with an eth0 on a bridge (in a switch namespace
// of its own), its egress shaped by tc tbf to a real link's rate, so
// cross-host figures measure what a network costs rather than loopback's
// memory copies. It needs root (ip netns, tc).
//
// A bed's namespaces are named after the process that made it
// (PREFIX<pid>-*): Close deletes them, with what still runs in them and the
// qdiscs on their links, and New first deletes the namespaces of processes
// of the same prefix that are gone, so a bench killed outright leaves
// nothing past its next start. What runs inside a host and what it
// measures belong to the benchmarks (bench/averaging, bench/hosts).
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Bed is hosts namespaces behind one bridge; host i has address Addr(i)
// on its eth0.
type Bed struct {
	ID    string
	Hosts []string // namespace names, host i at Hosts[i]
	net   int      // the third octet of 10.<site>.<net>.0/24
	site  int
}

// Addr is host i's address on the bed's network.
func (b *Bed) Addr(i int) string { return fmt.Sprintf("10.%d.%d.%d", b.site, b.net, 10+i) }

func sh(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New builds hosts namespaces named prefix<pid>-h<i> on 10.site.x.0/24
// (each benchmark its own site, so two never share a subnet), every
// host's egress shaped by tbf to rate (a tc rate such as "1gbit"; ""
// leaves the links unshaped).
func New(prefix string, site, hosts int, rate string) (*Bed, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the namespace test bed needs root (ip netns, tc)")
	}
	if rate != "" {
		if _, err := TCRate(rate); err != nil {
			return nil, err
		}
	}
	RemoveStale(prefix)
	b := &Bed{ID: fmt.Sprintf("%s%d", prefix, os.Getpid()), net: os.Getpid() % 250, site: site}
	sw := b.ID + "-sw"
	if err := sh("ip", "netns", "add", sw); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"ip", "-n", sw, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", sw, "link", "set", "br0", "up"},
	}
	for i := range hosts {
		ns := fmt.Sprintf("%s-h%d", b.ID, i)
		b.Hosts = append(b.Hosts, ns)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			// Both veth ends are made in the host and one moved into the
			// switch: no interface appears in the machine's own namespace.
			[]string{"ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", fmt.Sprintf("p%d", i), "netns", sw},
			[]string{"ip", "-n", sw, "link", "set", fmt.Sprintf("p%d", i), "master", "br0", "up"},
			[]string{"ip", "-n", ns, "addr", "add", b.Addr(i) + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
		)
		if rate != "" {
			steps = append(steps, []string{"ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"})
		}
	}
	for _, s := range steps {
		if err := sh(s...); err != nil {
			b.Close()
			return nil, err
		}
	}
	return b, nil
}

// Close kills what still runs in the bed's namespaces and deletes them
// (their links and qdiscs go with them).
func (b *Bed) Close() {
	for _, ns := range append([]string{b.ID + "-sw"}, b.Hosts...) {
		remove(ns)
	}
}

func remove(ns string) {
	if pids, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, p := range strings.Fields(string(pids)) {
			if n, err := strconv.Atoi(p); err == nil && n != os.Getpid() {
				syscall.Kill(n, syscall.SIGKILL)
			}
		}
	}
	exec.Command("ip", "netns", "del", ns).Run()
}

// RemoveStale deletes the namespaces of beds named prefix<pid> whose
// process is gone.
func RemoveStale(prefix string) {
	out, _ := exec.Command("ip", "netns", "list").Output()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `(\d+)-\S+`)
	for _, line := range strings.Split(string(out), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		remove(m[0])
	}
}

// SetLink cuts host i's link (up false) or restores it, at the bridge's
// end, as a pulled and replugged cable would: the host keeps its address
// and routes, its eth0 loses carrier, and every frame either way is
// dropped until the link is up again. Its TCP connections stay open and
// retransmit; whether one outlives the cut is up to its peers' timeouts.
func (b *Bed) SetLink(i int, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return sh("ip", "-n", b.ID+"-sw", "link", "set", fmt.Sprintf("p%d", i), state)
}

// Command runs name in host i's network namespace.
func (b *Bed) Command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", b.Hosts[i], name}, args...)...)
}

// Read is the trimmed output of a command run in host i's namespace.
func (b *Bed) Read(i int, name string, args ...string) (string, error) {
	out, err := b.Command(i, name, args...).Output()
	if err != nil {
		return "", fmt.Errorf("%s %s in %s: %w", name, strings.Join(args, " "), b.Hosts[i], err)
	}
	return strings.TrimSpace(string(out)), nil
}

// TxBytes is what host i's eth0 has sent, by the kernel's count (every
// frame: payload, TCP/IP and Ethernet headers, retransmissions).
func (b *Bed) TxBytes(i int) (uint64, error) {
	s, err := b.Read(i, "cat", "/sys/class/net/eth0/statistics/tx_bytes")
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}

// TCRate is a tc rate ("1gbit", "500mbit", "100kbit") in bits per second.
func TCRate(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				break
			}
			return f * u.mult, nil
		}
	}
	return 0, fmt.Errorf("bad rate %q: want a tc rate such as 1gbit or 500mbit", s)
}
