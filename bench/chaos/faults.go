package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/internal/testutil/hostile"
)

// kind is one fault: apply injects it into r (whose processes are p) and
// reports false, injecting nothing, where it does not apply now.
type kind struct {
	name  string
	apply func(h *harness, r *run, p procs) bool
}

var kinds = []kind{
	{"kill_worker", killWorker},
	{"kill_trainer", func(h *harness, r *run, p procs) bool { return killPlugin(h, r, p.trainers, true) }},
	{"kill_averager", func(h *harness, r *run, p procs) bool { return killPlugin(h, r, p.averagers, false) }},
	{"stop_worker", stopWorker},
	{"cut_link_short", func(h *harness, r *run, p procs) bool { return cutLink(h, r, p, shortCut) }},
	{"cut_link_long", func(h *harness, r *run, p procs) bool { return cutLink(h, r, p, longCut) }},
	{"hostile", hostileBurst},
	{"kill_coordinator", killCoordinator},
}

// inject applies the next kind of the seeded cycle that applies now.
func (h *harness) inject(r *run, p procs) bool {
	for range kinds {
		if len(h.order) == 0 {
			h.order = h.rng.Perm(len(kinds))
		}
		k := kinds[h.order[0]]
		if !k.apply(h, r, p) {
			// Try the next kind; this one waits for its turn in a
			// later cycle.
			h.order = append(h.order[1:], h.order[0])
			continue
		}
		h.order = h.order[1:]
		h.res.FaultsInjected++
		h.res.Faults[k.name]++
		fmt.Fprintf(os.Stderr, "chaos: fault %d: %s (%s)\n", h.res.FaultsInjected, k.name, r.dir)
		return true
	}
	return false
}

// pick is a seeded choice among pids' ranks.
func (h *harness) pick(pids map[uint32]int) (uint32, int) {
	ranks := make([]uint32, 0, len(pids))
	for r := range pids {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	r := ranks[h.rng.IntN(len(ranks))]
	return r, pids[r]
}

// killWorker SIGKILLs a rank's worker while another rank lives on.
func killWorker(h *harness, r *run, p procs) bool {
	if len(p.workers) < 2 {
		return false
	}
	_, pid := h.pick(p.workers)
	return syscall.Kill(pid, syscall.SIGKILL) == nil
}

// stopWorker SIGSTOPs a rank's worker past the heartbeat timeout, then
// lets it go on (if the launcher has not ended it).
func stopWorker(h *harness, r *run, p procs) bool {
	if len(p.workers) < 2 {
		return false
	}
	_, pid := h.pick(p.workers)
	if syscall.Kill(pid, syscall.SIGSTOP) != nil {
		return false
	}
	time.Sleep(heartbeatTimeout + 1500*time.Millisecond)
	syscall.Kill(pid, syscall.SIGCONT)
	return true
}

// maxPluginKills keeps a rank inside its restart budget (plugin_restarts
// = 3), so a plugin fault stays one and does not end the rank.
const maxPluginKills = 3

// killPlugin SIGKILLs a rank's trainer or averager. A killed trainer's
// plan is handed out again, the samples it trained of it included: that
// epoch's trainings by the rank before the kill may be trained again.
func killPlugin(h *harness, r *run, pids map[uint32]int, trainer bool) bool {
	live := map[uint32]int{}
	for rank, pid := range pids {
		if r.pluginKills[rank] < maxPluginKills {
			live[rank] = pid
		}
	}
	if len(live) == 0 {
		return false
	}
	rank, pid := h.pick(live)
	if syscall.Kill(pid, syscall.SIGKILL) != nil {
		return false
	}
	r.pluginKills[rank]++
	if trainer {
		// The dead trainer's last writes are done once its process is
		// gone; the ledger's size then bounds what it trained.
		waitGone(pid, 2*time.Second)
		to := fileSize(r.ledger)
		if epoch, ok := lastEpochOf(r.ledger, rank, to); ok {
			r.losts = append(r.losts, lost{cause: "trainer_killed", epoch: epoch, rank: rank, from: r.incarnationStart, to: to})
		}
	}
	return true
}

func waitGone(pid int, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hostileBurst throws hostile connections at the coordinator's control
// port from inside the coordinator's host (this program again, with
// -hostile-at), in the background (a silent one waits out the handshake
// timeout): each must be dropped. Connections the server refused because
// the run had ended are not counted against it.
func hostileBurst(h *harness, r *run, _ procs) bool {
	garbage := make([]byte, 96)
	for i := range garbage {
		garbage[i] = byte(h.rng.Uint32())
	}
	cmd := h.bed.Command(0, h.self, "-hostile-at", r.control, "-garbage", hex.EncodeToString(garbage))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		h.problem("hostile burst: %v", err)
		return false
	}
	if err := cmd.Start(); err != nil {
		h.problem("hostile burst: %v", err)
		return false
	}
	done := make(chan struct{})
	h.wg.Add(2)
	go func() {
		// A soak told to stop ends its bursts too: they hold nothing
		// but their connections.
		defer h.wg.Done()
		select {
		case <-h.ctx.Done():
			cmd.Process.Kill()
		case <-done:
		}
	}()
	go func() {
		defer h.wg.Done()
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.mu.Lock()
			h.res.HostileKept++
			h.mu.Unlock()
			h.problem("hostile at %s: %s", r.control, sc.Text())
		}
		if err := cmd.Wait(); err != nil && h.ctx.Err() == nil {
			h.problem("hostile burst at %s: %v", r.control, err)
		}
	}()
	return true
}

// hostileMain is -hostile-at: each hostile case, 20 connections at once,
// each of which addr must drop within 20 s. It prints a line for each
// case that kept a connection open, and exits 0 unless it could not run.
func hostileMain(addr, garbageHex string) int {
	garbage, err := hex.DecodeString(garbageHex)
	if err != nil || len(garbage) == 0 {
		fmt.Fprintf(os.Stderr, "chaos: -garbage %q: want hex bytes\n", garbageHex)
		return 2
	}
	for _, c := range hostile.Cases(garbage) {
		err := hostile.Burst(context.Background(), addr, c, 20, 20*time.Second)
		if err != nil && strings.Contains(err.Error(), "kept the connection open") {
			fmt.Printf("%s: %v\n", c.Name, err)
		}
	}
	return 0
}

// The link cuts: one TCP rides out (its retransmissions at 0.2 and 0.6 s
// after the cut land within the heartbeat timeout), and one past the
// heartbeat timeout and the workers' liveness timeout (3 s), as long as
// stop_worker's pause.
const (
	shortCut = 500 * time.Millisecond
	longCut  = heartbeatTimeout + 1500*time.Millisecond
)

// cutLink cuts a rank's link at the bridge for d, while another rank
// lives on, then restores it, and checks the outcome in the background: a
// cut shorter than the heartbeat timeout leaves the rank in the run (no
// death recorded for it); a longer one is its death (a death record for
// it, its worker gone within its liveness timeout), whose work the death
// record accounts for as for any other death.
func cutLink(h *harness, r *run, p procs, d time.Duration) bool {
	if len(p.workers) < 2 {
		return false
	}
	rank, _ := h.pick(p.workers)
	w, coordExited := r.workers[rank], r.exited
	start := time.Now()
	if err := h.bed.SetLink(int(rank)+1, false); err != nil {
		h.problem("cutting rank %d's link: %v", rank, err)
		return false
	}
	time.Sleep(d)
	if err := h.bed.SetLink(int(rank)+1, true); err != nil {
		// A link left cut is the death of the rank, and of every later
		// run's rank on that host: stop here.
		h.problem("restoring rank %d's link: %v", rank, err)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if d < heartbeatTimeout {
			time.Sleep(heartbeatTimeout + time.Second)
			if died(r, rank, start) {
				h.problem("run in %s: rank %d declared dead after a %v link cut, which its heartbeat timeout (%v) should have outlasted", r.dir, rank, d, heartbeatTimeout)
			}
			return
		}
		select {
		case <-w.exited:
		case <-time.After(livenessTimeout + 10*time.Second):
			h.problem("run in %s: rank %d's worker still running %v after a %v link cut", r.dir, rank, livenessTimeout+10*time.Second, d)
			return
		}
		select {
		case <-coordExited:
			return // the run ended (or its coordinator was killed) first
		default:
		}
		if !died(r, rank, start) {
			h.problem("run in %s: rank %d's worker ended after a %v link cut, and the coordinator recorded no death", r.dir, rank, d)
		}
	}()
	return true
}

// died reports whether the run's coordinator recorded a death of rank
// since.
func died(r *run, rank uint32, since time.Time) bool {
	var d record.DeathRecord
	if err := record.ReadJSON(filepath.Join(r.out, record.DeathsDir, fmt.Sprintf("rank-%d.json", rank)), "death record", &d); err != nil {
		return false
	}
	return !d.Time.Before(since)
}

// killCoordinator SIGKILLs the coordinator, once a checkpoint exists, and
// at once starts another with --resume on its address: the workers wait
// their liveness timeout for it and come back with their plugins and
// models. When the cohort had lost a rank by its last consensus, the new
// coordinator resumes from the checkpoint instead (the workers load it
// into their plugins) and the harness starts the missing rank's worker,
// as an operator would.
func killCoordinator(h *harness, r *run, _ procs) bool {
	dir := filepath.Join(r.out, checkpoint.CheckpointsDir)
	last, err := checkpoint.LastCheckpoint(dir)
	if err != nil {
		return false
	}
	if r.cmd.Process.Signal(syscall.SIGKILL) != nil {
		return false
	}
	<-r.exited
	cons, err := checkpoint.ReadConsensus(dir)
	if err != nil {
		h.problem("after killing the coordinator in %s: %v", r.dir, err)
	}
	if cons != nil && cons.Base == last && len(cons.Live) == ranks {
		r.comebacks = append(r.comebacks, fileSize(r.ledger))
	} else if err := r.killed(); err != nil {
		h.problem("after killing the coordinator in %s: %v", r.dir, err)
		return true
	}
	if err := r.start(true); err != nil {
		h.problem("resuming %s: %v", r.dir, err)
	}
	return true
}
