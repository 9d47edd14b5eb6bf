package main

// The -netns rows: hosts as network namespaces on this machine, joined by a
// bridge, each host's link shaped to a real bandwidth with tc, so the
// cross-host rows measure what a network costs rather than loopback's
// memory copies. Needs root (ip netns, tc); every namespace is deleted when
// the rows are done.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cohortdl/cohort/bench/internal/netns"
	"github.com/cohortdl/cohort/core/reduceserver"
)

// nsBed is a namespace test bed (bench/internal/netns) whose hosts hold
// perHost ranks each.
type nsBed struct {
	*netns.Bed
	perHost int
}

// host is the host of rank r: ranks fill hosts in order.
func (b *nsBed) host(r int) int { return r / b.perHost }

// newNSBed builds hosts namespaces with perHost ranks each, every host's
// egress shaped by tbf to rate (a tc rate, "1gbit").
func newNSBed(hosts, perHost int, rate string) (*nsBed, error) {
	b, err := netns.New("cohort-bench-", 78, hosts, rate)
	if err != nil {
		return nil, err
	}
	return &nsBed{Bed: b, perHost: perHost}, nil
}

// listen starts the reduce server in host 0's namespace: a goroutine locked
// to a thread enters it, creates the listening socket (which stays there)
// and returns the thread to the machine's namespace before unlocking it.
// Should the way back fail, the thread stays locked and ends with the
// goroutine, so no other goroutine ever runs in the namespace.
func (b *nsBed) listen(ctx context.Context, cfg reduceserver.Config) (*reduceserver.Server, error) {
	cfg.Addr = b.Addr(0) + ":0"
	type got struct {
		s   *reduceserver.Server
		err error
	}
	c := make(chan got, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- got{err: fmt.Errorf("open this thread's namespace: %w", err)}
			return
		}
		defer unix.Close(home)
		fd, err := unix.Open("/var/run/netns/"+b.Hosts[0], unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- got{err: fmt.Errorf("open host 0's namespace: %w", err)}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			c <- got{err: fmt.Errorf("enter host 0's namespace: %w", err)}
			return
		}
		s, err := reduceserver.Listen(ctx, cfg)
		if unix.Setns(home, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		c <- got{s, err}
	}()
	g := <-c
	return g.s, g.err
}

// command runs the plugin for rank r in its host's namespace.
func (b *nsBed) command(r int, plugin string) *exec.Cmd {
	return exec.Command("ip", "netns", "exec", b.Hosts[b.host(r)], plugin)
}

// gloo runs gloo_allreduce.py one rank per process, each in its host's
// namespace, and returns rank 0's median.
func (b *nsBed) gloo(python, script string, n int, mb float64, iters int) (float64, error) {
	master := fmt.Sprintf("%s:%d", b.Addr(0), 29500+os.Getpid()%1000)
	cmds := make([]*exec.Cmd, n)
	var out strings.Builder
	for r := range n {
		cmds[r] = exec.Command("ip", "netns", "exec", b.Hosts[b.host(r)], python, script, "--rank", strconv.Itoa(r), "--world", strconv.Itoa(n),
			"--master", master, "--iface", "eth0", "--mb", strconv.FormatFloat(mb, 'f', -1, 64), "--iters", strconv.Itoa(iters))
		cmds[r].Stderr = os.Stderr
		if r == 0 {
			cmds[r].Stdout = &out
		}
		if err := cmds[r].Start(); err != nil {
			return 0, err
		}
	}
	var errs []error
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", strings.Join(c.Args, " "), err))
		}
	}
	if len(errs) > 0 {
		return 0, errs[0]
	}
	for _, line := range strings.Split(out.String(), "\n") {
		var r struct {
			Peer    string  `json:"peer"`
			MedianS float64 `json:"median_s"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Peer == "gloo" {
			return r.MedianS, nil
		}
	}
	return 0, fmt.Errorf("no JSON result line from gloo rank 0: %q", out.String())
}

type netnsResult struct {
	Kind    string  `json:"kind"`
	Hosts   int     `json:"hosts"`
	PerHost int     `json:"ranks_per_host"`
	Wire    string  `json:"wire"`
	Bytes   int64   `json:"bytes"`
	Rate    string  `json:"rate"`
	CohortS float64 `json:"cohort_median_s"`
	GlooS   float64 `json:"gloo_median_s,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`
	FloorS  float64 `json:"link_floor_s"`
	XFloor  float64 `json:"ratio_to_floor"`
	// TCPFloorS is the link floor with the bytes TCP/IP and Ethernet add
	// to each segment, GlooXFloor gloo's time over the f32 wire's link
	// floor, and Bound the lowest ratio to gloo any all-reduce over TCP
	// could reach here (TCPFloorS/GlooS).
	TCPFloorS  float64 `json:"tcp_floor_s"`
	GlooXFloor float64 `json:"gloo_ratio_to_floor,omitempty"`
	Bound      float64 `json:"ratio_bound,omitempty"`
	LinkBytes  uint64  `json:"link_bytes"`
}

// segmentOverhead is the bytes a shaped link carries per payload byte of a
// full TCP segment in namespace ns: the frame (MTU plus the 14-byte
// Ethernet header, which tbf counts) over its payload (MTU less the IP and
// TCP headers and, when on, the 12-byte timestamps option).
func segmentOverhead(ns string) (float64, error) {
	read := func(args ...string) (int, error) {
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).Output()
		if err != nil {
			return 0, fmt.Errorf("%s in %s: %w", strings.Join(args, " "), ns, err)
		}
		return strconv.Atoi(strings.TrimSpace(string(out)))
	}
	mtu, err := read("cat", "/sys/class/net/eth0/mtu")
	if err != nil {
		return 0, err
	}
	ts, err := read("sysctl", "-n", "net.ipv4.tcp_timestamps")
	if err != nil {
		return 0, err
	}
	o, err := frameOverhead(mtu, ts != 0)
	if err != nil {
		return 0, fmt.Errorf("eth0 in %s: %w", ns, err)
	}
	return o, nil
}

// frameOverhead is an Ethernet frame's bytes over its TCP payload for a
// full segment at mtu, with or without the timestamps option.
func frameOverhead(mtu int, timestamps bool) (float64, error) {
	payload := mtu - 40
	if timestamps {
		payload -= 12
	}
	if payload <= 0 {
		return 0, fmt.Errorf("MTU %d leaves no room for a TCP payload", mtu)
	}
	return float64(mtu+14) / float64(payload), nil
}

// netnsRows prints the shaped-link rows: for each layout (hosts × ranks
// per host) cohort on an f32 and a bf16 wire against gloo (f32), and the
// link floor 2·(H−1)/H·S/B of the bytes the wire carries. No all-reduce
// sends fewer bytes per host (each host's S must leave it once summed and
// come back once final), so gloo's own distance to the floor bounds the
// ratio any backend can reach: the rows print that bound too.
func netnsRows(mb float64, iters int, rate, pluginPath, settings, python, gloo string, noGloo bool) error {
	if os.Geteuid() != 0 {
		fmt.Println("netns rows skipped: they need root (ip netns, tc)")
		return nil
	}
	rateBits, err := netns.TCRate(rate)
	if err != nil {
		return err
	}
	pluginPath, gloo, cleanup, err := resolve(pluginPath, gloo, noGloo)
	if err != nil {
		return err
	}
	defer cleanup()
	var base map[string]any
	if err := json.Unmarshal([]byte(settings), &base); err != nil {
		return fmt.Errorf("bad -settings: %w", err)
	}
	elems := int64(mb * 1e6 / 4)
	fmt.Printf("\nnetns: hosts are network namespaces, each host's link shaped by tc tbf to %s; %.0f MB float32 per rank\n", rate, mb)
	fmt.Printf("%-6s  %5s  %8s  %5s  %10s  %10s  %7s  %10s  %7s  %12s  %11s  %10s  %7s\n", "rows", "hosts", "per host", "wire", "cohort ms", "gloo ms", "ratio", "floor ms", "×floor", "link MB", "gloo ×floor", "TCP floor", "bound")
	var out []netnsResult
	for _, l := range []struct{ hosts, perHost int }{{2, 2}, {4, 1}} {
		bed, err := newNSBed(l.hosts, l.perHost, rate)
		if err != nil {
			return err
		}
		n := l.hosts * l.perHost
		over, err := segmentOverhead(bed.Hosts[0])
		if err != nil {
			bed.Close()
			return err
		}
		var g float64
		if !noGloo {
			if g, err = bed.gloo(python, gloo, n, mb, iters); err != nil {
				bed.Close()
				return fmt.Errorf("gloo, %d hosts × %d: %w", l.hosts, l.perHost, err)
			}
		}
		h := float64(l.hosts)
		// floor is the link floor of a round of wireBytes per host.
		floor := func(wireBytes float64) float64 { return 2 * (h - 1) / h * wireBytes * 8 / rateBits }
		for _, wire := range []string{"f32", "bf16"} {
			set := func(r int) string {
				m := map[string]any{}
				for k, v := range base {
					m[k] = v
				}
				m["host"], m["wire"] = fmt.Sprintf("h%d", bed.host(r)), wire
				b, _ := json.Marshal(m)
				return string(b)
			}
			times, moved, err := benchOn(bed, n, elems, iters, pluginPath, set)
			if err != nil {
				bed.Close()
				return fmt.Errorf("netns %d hosts × %d, %s: %w", l.hosts, l.perHost, wire, err)
			}
			sort.Float64s(times)
			wireBytes := float64(elems) * 4
			if wire == "bf16" {
				wireBytes /= 2
			}
			r := netnsResult{Kind: "netns", Hosts: l.hosts, PerHost: l.perHost, Wire: wire, Bytes: elems * 4, Rate: rate,
				CohortS: times[len(times)/2], FloorS: floor(wireBytes), LinkBytes: moved / 2}
			r.XFloor = r.CohortS / r.FloorS
			r.TCPFloorS = r.FloorS * over
			glooCol, ratioCol, gxCol, boundCol := "-", "-", "-", "-"
			if g > 0 {
				r.GlooS, r.Ratio = g, r.CohortS/g
				r.GlooXFloor = g / floor(float64(elems)*4)
				r.Bound = r.TCPFloorS / g
				glooCol, ratioCol = fmt.Sprintf("%.1f", g*1e3), fmt.Sprintf("%.3f", r.Ratio)
				gxCol, boundCol = fmt.Sprintf("%.3f", r.GlooXFloor), fmt.Sprintf("%.3f", r.Bound)
			}
			fmt.Printf("%-6s  %5d  %8d  %5s  %10.1f  %10s  %7s  %10.1f  %7.2f  %12.1f  %11s  %10.1f  %7s\n", "netns", l.hosts, l.perHost, wire,
				r.CohortS*1e3, glooCol, ratioCol, r.FloorS*1e3, r.XFloor, float64(r.LinkBytes)/1e6, gxCol, r.TCPFloorS*1e3, boundCol)
			out = append(out, r)
		}
		bed.Close()
	}
	for _, r := range out {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
	return nil
}
