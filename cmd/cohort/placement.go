package main

import (
	"fmt"
	"net"
	"strconv"
)

// placement is where a worker sits in its run: its global rank, the world
// size, how many ranks share its host, and the coordinator's address.
type placement struct {
	rank, world, localRanks int
	coordinator             string
	// from names, per field, the convention that set it, for errors and
	// the worker's first log line.
	from map[string]string
}

// A launcher convention: the variables a scheduler or launcher sets for
// each process, tried in order after the command line. The first that sets
// a field wins.
type convention struct {
	name                    string
	rank, world, localRanks string
	coordinator             string // HOST:PORT
}

var conventions = []convention{
	// cohort's own, for launchers of any kind.
	{name: "cohort", rank: "COHORT_RANK", world: "COHORT_WORLD", localRanks: "COHORT_LOCAL_RANKS", coordinator: "COHORT_COORDINATOR"},
	// torchrun and the job templates written for it. Its MASTER_PORT is
	// its own rendezvous's port, never cohort's coordinator: the address
	// comes from --coordinator or $COHORT_COORDINATOR (":PORT" takes its
	// host from $MASTER_ADDR).
	{name: "torchrun", rank: "RANK", world: "WORLD_SIZE", localRanks: "LOCAL_WORLD_SIZE"},
	// srun: one task per rank. SLURM_NTASKS_PER_NODE is set only with
	// --ntasks-per-node; without it every rank counts as alone on its host.
	{name: "slurm", rank: "SLURM_PROCID", world: "SLURM_NTASKS", localRanks: "SLURM_NTASKS_PER_NODE"},
	// A Kubernetes Indexed Job: the pod's completion index is its rank.
	{name: "kubernetes", rank: "JOB_COMPLETION_INDEX"},
}

// resolvePlacement fills what the command line left unset (flagged reports
// which fields it set) from the environment, then checks the whole.
func resolvePlacement(p placement, flagged map[string]bool, getenv func(string) string) (placement, error) {
	p.from = map[string]string{}
	for _, f := range []string{"rank", "world", "local-ranks", "coordinator"} {
		if flagged[f] {
			p.from[f] = "--" + f
		}
	}
	setInt := func(field string, dst *int, c convention, name string) error {
		if p.from[field] != "" || name == "" {
			return nil
		}
		v := getenv(name)
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("$%s = %q (%s's %s): not a whole number", name, v, c.name, field)
		}
		*dst, p.from[field] = n, "$"+name
		return nil
	}
	for _, c := range conventions {
		if err := setInt("rank", &p.rank, c, c.rank); err != nil {
			return p, err
		}
		if err := setInt("world", &p.world, c, c.world); err != nil {
			return p, err
		}
		if err := setInt("local-ranks", &p.localRanks, c, c.localRanks); err != nil {
			return p, err
		}
		if p.from["coordinator"] != "" {
			continue
		}
		if c.coordinator != "" && getenv(c.coordinator) != "" {
			p.coordinator, p.from["coordinator"] = getenv(c.coordinator), "$"+c.coordinator
		}
	}
	if host, port, err := net.SplitHostPort(p.coordinator); err == nil && host == "" && getenv("MASTER_ADDR") != "" {
		p.coordinator = net.JoinHostPort(getenv("MASTER_ADDR"), port)
		p.from["coordinator"] += " on $MASTER_ADDR"
	}
	if p.from["local-ranks"] == "" {
		p.localRanks = 1
	}
	return p, p.check()
}

// check refuses a placement a worker cannot join with, naming where each
// bad value came from.
func (p placement) check() error {
	from := func(f string) string {
		if s := p.from[f]; s != "" {
			return " (from " + s + ")"
		}
		return ""
	}
	switch {
	case p.coordinator == "":
		return usageError("no coordinator address: set --coordinator or $COHORT_COORDINATOR (:PORT takes the host from $MASTER_ADDR; torchrun's MASTER_PORT is its rendezvous's, not cohort's)")
	case p.from["rank"] == "":
		return usageError("no rank: set --rank, or run under a launcher that sets one ($COHORT_RANK, $RANK, $SLURM_PROCID, $JOB_COMPLETION_INDEX)")
	case p.from["world"] == "":
		return usageError("no world size: set --world, $COHORT_WORLD, $WORLD_SIZE or $SLURM_NTASKS")
	case p.world < 1 || int64(p.world) > int64(^uint32(0)):
		return usageError("world size %d%s: it must be at least 1", p.world, from("world"))
	case p.rank < 0 || p.rank >= p.world:
		return usageError("rank %d%s: it must be in 0..%d", p.rank, from("rank"), p.world-1)
	case p.localRanks < 1 || p.localRanks > p.world:
		return usageError("local ranks %d%s: it must be in 1..%d", p.localRanks, from("local-ranks"), p.world)
	}
	if _, _, err := net.SplitHostPort(p.coordinator); err != nil {
		return usageError("coordinator address %q%s: %v", p.coordinator, from("coordinator"), err)
	}
	return nil
}
