package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/core/coordinator/record"
	"github.com/cohortdl/cohort/core/wire"
)

// runSize runs one coordinator with n simulated ranks and measures it.
func runSize(parent context.Context, o options, n int) (*result, error) {
	ctx, cancel := context.WithTimeout(parent, o.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "cohort-scale-")
	if err != nil {
		return nil, fmt.Errorf("make a run directory: %w", err)
	}
	defer os.RemoveAll(dir)
	var raw [32]byte
	rand.Read(raw[:])
	secret := []byte(hex.EncodeToString(raw[:]))
	p := childParams{
		Ranks:            n,
		Epochs:           o.epochs,
		SyncEvery:        o.syncEvery,
		HeartbeatTimeout: o.hbTimeout,
		SecretFile:       filepath.Join(dir, "secret"),
		Out:              filepath.Join(dir, "out"),
	}
	if err := os.WriteFile(p.SecretFile, secret, 0o600); err != nil {
		return nil, fmt.Errorf("write the run secret: %w", err)
	}
	if o.profile != "" {
		p.CPUProfile = filepath.Join(o.profile, fmt.Sprintf("coordinator-%d.cpu.pprof", n))
		p.HeapProfile = filepath.Join(o.profile, fmt.Sprintf("coordinator-%d.allocs.pprof", n))
	}
	keys, err := wire.DeriveKeys(secret)
	if err != nil {
		return nil, err
	}
	child, err := startChild(ctx, p, filepath.Join(dir, "coordinator.log"))
	if err != nil {
		return nil, err
	}
	defer child.stop()

	rec := newRecorder()
	spec := &rankSpec{
		addr:      child.addr,
		keys:      keys,
		world:     uint32(n),
		samples:   uint64(n * o.batch * o.syncEvery * o.windows),
		batch:     uint32(o.batch),
		batchTime: o.batchTime,
		heartbeat: o.heartbeat,
	}
	start := time.Now()
	ranks := make([]*simRank, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range ranks {
		ranks[i] = newSimRank(spec, uint32(i), rec)
		wg.Go(func() { errs[i] = ranks[i].run(ctx) })
	}
	victims := victimsOf(n, o.killPct)
	killErr := make(chan error, 1)
	killCtx, stopKills := context.WithCancel(ctx)
	defer stopKills()
	go func() {
		if err := rec.waitRounds(killCtx, o.killAfter); err != nil {
			killErr <- err
			return
		}
		for i, id := range victims {
			kind := killClose
			if i >= len(victims)/2 {
				kind = killSilent
			}
			ranks[id].kill(kind)
		}
		killErr <- nil
	}()
	wg.Wait()
	runS := time.Since(start).Seconds()
	stopKills()
	rep, usage, childErr := child.wait()
	if err := <-killErr; err != nil {
		return nil, fmt.Errorf("%w (coordinator log %s)", err, child.logTail())
	}
	if err := errors.Join(append(errs, childErr)...); err != nil {
		return nil, fmt.Errorf("%w\ncoordinator log: %s", err, child.logTail())
	}
	if rep.Status != record.StatusCompleted {
		return nil, fmt.Errorf("the run ended %s: %s\ncoordinator log: %s", rep.Status, rep.Error, child.logTail())
	}

	res := &result{
		Ranks:            n,
		Status:           rep.Status,
		RunS:             runS,
		LivenessTimeoutS: o.hbTimeout.Seconds(),
		Deaths:           len(victims),
		Heartbeats:       rep.Heartbeat.Count,
		HeartbeatP50MS:   rep.Heartbeat.P50MS,
		HeartbeatP99MS:   rep.Heartbeat.P99MS,
		HeartbeatMaxMS:   rep.Heartbeat.MaxMS,
		CoordinatorRSSMB: float64(usage.Maxrss) / 1024, // KiB on Linux
		CoordinatorCPUS:  time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds(),
		Loop:             rep.Events,
	}
	rec.mu.Lock()
	res.FormationS = rec.formedAt.Sub(start).Seconds()
	rec.mu.Unlock()
	rounds := rec.roundMS()
	res.Rounds = len(rounds)
	res.RoundP50MS, res.RoundP99MS = quantile(rounds, 0.5), quantile(rounds, 0.99)
	byKind, undetected := rec.detections()
	res.CloseDetectMaxS = quantile(byKind[killClose], 1)
	res.SilentDetectMaxS = quantile(byKind[killSilent], 1)
	res.DeathDetectMaxS = max(res.CloseDetectMaxS, res.SilentDetectMaxS)
	if st := rep.Events["Batch"]; st != nil {
		res.BatchMeanMS = st.MeanMS
	}
	res.goals(undetected)
	return res, nil
}

// victimsOf picks the ranks to kill, spread over the world and never rank
// 0 (whose loss the coordinator's tests cover; here it would only move
// the evaluation).
func victimsOf(n int, pct float64) []uint32 {
	k := max(2, int(float64(n)*pct/100))
	k = min(k, n-1)
	out := make([]uint32, 0, k)
	for i := range k {
		out = append(out, uint32(1+i*(n-1)/k))
	}
	return out
}

// child is the coordinator's process.
type child struct {
	cmd    *exec.Cmd
	out    *bufio.Reader
	addr   string
	log    string
	waited bool
}

// startChild starts the coordinator child and reads its address.
func startChild(ctx context.Context, p childParams, logPath string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary: %w", err)
	}
	spec, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create the coordinator log: %w", err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.Stderr = logf
	// The coordinator goes with the harness, however the harness ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the coordinator: %w", err)
	}
	c := &child{cmd: cmd, out: bufio.NewReader(stdout), log: logPath}
	line, err := c.out.ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), listenPrefix)
	if err != nil || !ok {
		c.stop()
		return nil, fmt.Errorf("the coordinator did not say where it listens (first line %q, %v): %s", line, err, c.logTail())
	}
	c.addr = addr
	return c, nil
}

// wait reads the child's report and waits for it to exit.
func (c *child) wait() (*childReport, *syscall.Rusage, error) {
	line, readErr := c.out.ReadBytes('\n')
	err := c.cmd.Wait()
	c.waited = true
	if err != nil {
		return nil, nil, fmt.Errorf("the coordinator: %w", err)
	}
	var rep childReport
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, nil, fmt.Errorf("the coordinator's report %q: %w (read: %v)", line, err, readErr)
	}
	usage, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return nil, nil, errors.New("the coordinator's resource usage is not available on this system")
	}
	return &rep, usage, nil
}

// stop kills a child that has not been waited for.
func (c *child) stop() {
	if !c.waited {
		c.cmd.Process.Kill()
		c.cmd.Wait()
		c.waited = true
	}
}

// logTail is the end of the coordinator's log, for errors.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	const keep = 4000
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return string(b)
}
