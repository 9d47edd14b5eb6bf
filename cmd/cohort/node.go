package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/worker"
)

// How long a node's workers get to end after SIGTERM before they are
// killed: a worker's teardown stops its plugins within
// worker.shutdown_grace (5 s by default).
const nodeStopGrace = 15 * time.Second

func newNodeCommand(g *globals) *cobra.Command {
	var np nodePlacement
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run this host's ranks against a coordinator: one command per host",
		Long: `Starts this host's ranks, one 'cohort worker' each, against a coordinator
started apart ('cohort coordinator'), and waits for them. It is what runs
on each host of a multi-host run: by hand, from a plain ssh loop, from
torchrun's place in a job script, or under srun with one task per node.

Host I of N, with R ranks per host, runs the global ranks I·R .. I·R+R-1
of a run of N·R. The host's index and count come from the flags, else from
the launcher's variables:
  cohort      COHORT_NODE, COHORT_NODES
  torchrun    GROUP_RANK, and WORLD_SIZE with --nproc_per_node 1
  Slurm srun  SLURM_NODEID, SLURM_NNODES

The coordinator's address comes from --coordinator or $COHORT_COORDINATOR,
never from torchrun's MASTER_PORT (its rendezvous port); a --coordinator
of ":PORT" takes its host from $MASTER_ADDR.

Each rank is a process of its own: a rank that dies (killed, out of
memory) is reported and the others go on, as the coordinator re-forms the
cohort without it. SIGINT or SIGTERM is passed to every rank as SIGTERM.
Exit status 0 means at least one rank of this host saw the run to its end
cleanly; 1 that none did.`,
		Example: `  COHORT_SECRET_FILE=secret cohort node --coordinator head:7000 --nodes 2 --node 0 --ranks-per-node 4 --config cohort.hcl
  for i in 0 1; do ssh host$i COHORT_SECRET_FILE=secret cohort node --coordinator head:7000 --nodes 2 --node $i --ranks-per-node 4 --config cohort.hcl & done
  torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint head:29500 --no_python \
    cohort node --coordinator head:7000 --ranks-per-node 4 --config cohort.hcl`,
		Args: noArgs,
	}
	f := cmd.Flags()
	f.StringVar(&np.coordinator, "coordinator", "", "the coordinator's control address, HOST:PORT, or :PORT on $MASTER_ADDR (else $COHORT_COORDINATOR)")
	f.IntVar(&np.node, "node", 0, "this host's index, 0..nodes-1 (else from the launcher's variables)")
	f.IntVar(&np.nodes, "nodes", 0, "the hosts in the run (else from the launcher's variables)")
	f.IntVar(&np.perNode, "ranks-per-node", 1, "ranks on each host")
	secretFile := secretFileFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		flagged := map[string]bool{}
		for _, name := range []string{"node", "nodes", "coordinator"} {
			flagged[name] = cmd.Flags().Changed(name)
		}
		p, err := np.resolve(flagged, os.Getenv)
		if err != nil {
			return err
		}
		if _, err := g.loadConfig(); err != nil {
			return err
		}
		secret, err := loadSecret(*secretFile)
		if err != nil {
			return failed(err)
		}
		exe, err := os.Executable()
		if err != nil {
			return failed(fmt.Errorf("find this executable for the workers: %w", err))
		}
		signal.Ignore(syscall.SIGPIPE)
		logger := g.newLogger(os.Stderr, workerLogLevels).Named("node")
		return runNode(p, nodeRun{exe: exe, config: g.configPath, verbosity: g.verbosityFlag(), env: childEnv(secret), out: os.Stderr, log: logger})
	}
	return cmd
}

// nodePlacement is which ranks a node runs and where its coordinator is.
type nodePlacement struct {
	coordinator          string
	node, nodes, perNode int
	from                 map[string]string // the source of node, nodes and coordinator
}

// resolve fills what the flags left unset from the launcher's variables,
// then checks the whole.
func (np nodePlacement) resolve(flagged map[string]bool, getenv func(string) string) (nodePlacement, error) {
	p := np
	p.from = map[string]string{}
	for f, ok := range flagged {
		if ok {
			p.from[f] = "--" + f
		}
	}
	for _, v := range []struct {
		field string
		dst   *int
		names []string
	}{
		{"node", &p.node, []string{"COHORT_NODE", "GROUP_RANK", "SLURM_NODEID"}},
		{"nodes", &p.nodes, []string{"COHORT_NODES", "WORLD_SIZE", "SLURM_NNODES"}},
	} {
		for _, name := range v.names {
			if p.from[v.field] != "" || getenv(name) == "" {
				continue
			}
			n, err := strconv.Atoi(getenv(name))
			if err != nil {
				return p, usageError("$%s = %q: not a whole number", name, getenv(name))
			}
			*v.dst, p.from[v.field] = n, "$"+name
		}
	}
	// torchrun starts one process per --nproc_per_node: a node is one per
	// host, and starts the host's ranks itself.
	if n := getenv("LOCAL_WORLD_SIZE"); n != "" && n != "1" && getenv("GROUP_RANK") != "" {
		return p, usageError("$LOCAL_WORLD_SIZE = %s: run cohort node once per host (torchrun --nproc_per_node 1) and set --ranks-per-node", n)
	}
	if p.from["coordinator"] == "" && getenv("COHORT_COORDINATOR") != "" {
		p.coordinator, p.from["coordinator"] = getenv("COHORT_COORDINATOR"), "$COHORT_COORDINATOR"
	}
	// ":PORT" is the coordinator on torchrun's head host; the port is
	// always cohort's own, never the rendezvous's MASTER_PORT.
	if host, port, err := net.SplitHostPort(p.coordinator); err == nil && host == "" {
		if getenv("MASTER_ADDR") == "" {
			return p, usageError("coordinator %q (from %s) names no host, and $MASTER_ADDR is not set", p.coordinator, p.from["coordinator"])
		}
		p.coordinator = net.JoinHostPort(getenv("MASTER_ADDR"), port)
		p.from["coordinator"] += " on $MASTER_ADDR"
	}
	switch {
	case p.coordinator == "":
		return p, usageError("no coordinator address: set --coordinator or $COHORT_COORDINATOR (torchrun's MASTER_PORT is its rendezvous, not cohort's)")
	case p.from["nodes"] == "":
		return p, usageError("no host count: set --nodes, $COHORT_NODES, or run under torchrun (--nproc_per_node 1) or srun")
	case p.nodes < 1:
		return p, usageError("%d hosts (from %s): want at least 1", p.nodes, p.from["nodes"])
	case p.from["node"] == "" && p.nodes > 1:
		return p, usageError("no host index: set --node, $COHORT_NODE, or run under torchrun or srun")
	case p.node < 0 || p.node >= p.nodes:
		return p, usageError("host index %d (from %s): want 0..%d", p.node, p.from["node"], p.nodes-1)
	case p.perNode < 1 || int64(p.nodes)*int64(p.perNode) > int64(^uint32(0)):
		return p, usageError("--ranks-per-node %d: want at least 1, and at most 2^32-1 ranks in all", p.perNode)
	}
	if _, _, err := net.SplitHostPort(p.coordinator); err != nil {
		return p, usageError("coordinator address %q (from %s): %v", p.coordinator, p.from["coordinator"], err)
	}
	return p, nil
}

// ranks are the global ranks this node runs, and the world size.
func (p nodePlacement) ranks() (first, world int) {
	return p.node * p.perNode, p.nodes * p.perNode
}

// nodeRun is how a node starts its workers.
type nodeRun struct {
	exe       string // the cohort binary
	config    string // --config, passed on ("" for none)
	verbosity []string
	env       []string
	out       io.Writer // the workers' output, each line prefixed with its rank
	log       hclog.Logger
}

// runNode starts p's ranks and waits for them; SIGINT or SIGTERM is passed
// on to each as SIGTERM.
func runNode(p nodePlacement, r nodeRun) error {
	first, world := p.ranks()
	// Arenas of this host's workers killed earlier go first; those of this
	// node's workers that die go once they are all reaped.
	arenaLog := r.log.Named("arenas")
	worker.SweepArenas("", arenaLog)
	defer worker.SweepArenas("", arenaLog)

	kids := newChildren(p.perNode)
	defer kids.killAll()
	out := &lockedWriter{w: r.out}
	for i := range p.perNode {
		rank := first + i
		args := append([]string{"worker", "--coordinator", p.coordinator, "--rank", strconv.Itoa(rank),
			"--world", strconv.Itoa(world), "--local-ranks", strconv.Itoa(p.perNode)}, r.verbosity...)
		if r.config != "" {
			args = append(args, "--config", r.config)
		}
		pw := &prefixWriter{prefix: fmt.Sprintf("rank %d: ", rank), w: out}
		if err := kids.start(r.exe, args, r.env, strconv.Itoa(rank), io.Discard, pw); err != nil {
			return failed(fmt.Errorf("start rank %d: %w", rank, err))
		}
	}
	r.log.Info("ranks started", "ranks", fmt.Sprintf("%d-%d", first, first+p.perNode-1), "world", world, "coordinator", p.coordinator)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var stopped <-chan time.Time
	clean := 0
	for left := p.perNode; left > 0; {
		select {
		case e := <-kids.exits:
			left--
			if e.err == nil {
				clean++
			} else {
				r.log.Warn("rank ended before the run did; the others go on", "rank", e.name, "error", e.err)
			}
		case s := <-sigs:
			r.log.Info("passing the signal on to the ranks", "signal", s)
			kids.signalAll(syscall.SIGTERM)
			if stopped == nil {
				stopped = time.After(nodeStopGrace)
			}
		case <-stopped:
			r.log.Warn("ranks still running after SIGTERM; killing them", "grace", nodeStopGrace)
			kids.killAll()
		}
	}
	if clean == 0 {
		return failed(fmt.Errorf("no rank of this host ended cleanly (ranks %d-%d)", first, first+p.perNode-1))
	}
	r.log.Info("node done", "clean", clean, "ranks", p.perNode)
	return nil
}

// signalAll sends sig to every worker not yet reaped (the worker alone: it
// stops its own plugins).
func (c *children) signalAll(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.procs {
		if !ch.reaped {
			ch.cmd.Process.Signal(sig)
		}
	}
}
