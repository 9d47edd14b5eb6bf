package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// childEnv is the workers' environment: the run's secret through the
// environment (never argv), no other secret source that would win over it,
// and the marker that makes them leave Ctrl-C to the launcher.
func childEnv(secret []byte) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, envSecret+"=") || strings.HasPrefix(kv, envSecretFile+"=") || strings.HasPrefix(kv, envRunChild+"=")
	})
	return append(env, envSecret+"="+string(secret), envRunChild+"=1")
}

// childExit is a worker that ended.
type childExit struct {
	name string
	err  error
}

// children are the run's worker processes. Each runs in its own process
// group, so a terminal's Ctrl-C reaches only the launcher, and is sent
// SIGTERM if the launcher dies (Pdeathsig), so that it tears down and
// removes its arena. One goroutine per child waits for it; wg joins them.
//
// Pdeathsig fires when the thread that forked the child ends, not the
// process, and the Go runtime ends a thread whose locked goroutine
// returns. So every child is forked by one goroutine locked to its thread
// until every child is reaped (killAll): that thread lives as long as any
// child does, unless the launcher itself dies.
type children struct {
	mu    sync.Mutex
	procs []*child
	exits chan childExit
	wg    sync.WaitGroup

	forks    chan *exec.Cmd
	started  chan error
	forker   sync.WaitGroup
	stopOnce sync.Once
}

type child struct {
	cmd    *exec.Cmd
	reaped bool // guarded by children.mu
}

func newChildren(n int) *children {
	c := &children{exits: make(chan childExit, n), forks: make(chan *exec.Cmd), started: make(chan error)}
	c.forker.Add(1)
	go func() {
		defer c.forker.Done()
		runtime.LockOSThread()
		// Unlocked, the thread goes back to the runtime instead of ending.
		defer runtime.UnlockOSThread()
		for cmd := range c.forks {
			c.started <- cmd.Start()
		}
	}()
	return c
}

var errChildrenDone = errors.New("the run's workers are all reaped; no more start")

// start runs a worker whose output goes to log, and the lines console
// keeps to its writer.
func (c *children) start(exe string, args, env []string, name string, log io.Writer, console *prefixWriter) error {
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	pw := console
	out := io.MultiWriter(log, pw)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// A plugin that inherited the output pipe must not hold up Wait.
	cmd.WaitDelay = 2 * time.Second
	ch := &child{cmd: cmd}
	c.mu.Lock()
	if c.forks == nil {
		c.mu.Unlock()
		return errChildrenDone
	}
	// Under mu, so killAll cannot close forks meanwhile; the forker takes
	// no lock.
	c.forks <- cmd
	if err := <-c.started; err != nil {
		c.mu.Unlock()
		return err
	}
	c.procs = append(c.procs, ch)
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := cmd.Wait()
		// A worker killed before its teardown leaves its temporary
		// files (its plugins' sockets); its plugins die with it.
		if rerr := removeWorkerTemp(cmd.Process.Pid); rerr != nil {
			fmt.Fprintf(pw, "removing the temporary files of %s: %v\n", name, rerr)
		}
		pw.flush()
		c.mu.Lock()
		ch.reaped = true
		c.mu.Unlock()
		select {
		case c.exits <- childExit{name: name, err: err}:
		default: // more exits than ranks cannot happen; never block
		}
	}()
	return nil
}

// kill kills the process group of the i-th worker started (rank i's),
// unless it is reaped already or was never started.
func (c *children) kill(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i >= 0 && i < len(c.procs) && !c.procs[i].reaped {
		syscall.Kill(-c.procs[i].cmd.Process.Pid, syscall.SIGKILL)
	}
}

// killAll kills the process group of every worker not yet reaped (the
// worker and the plugins it started), waits until all are reaped, and
// ends the forking goroutine: start fails from then on. A reaped worker's
// group is left alone: its id may name another group by now, and its
// plugins exit when it does.
func (c *children) killAll() {
	c.mu.Lock()
	for _, ch := range c.procs {
		if !ch.reaped {
			syscall.Kill(-ch.cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	c.mu.Unlock()
	c.wg.Wait()
	c.stopOnce.Do(func() {
		c.mu.Lock()
		close(c.forks)
		c.forks = nil
		c.mu.Unlock()
		c.forker.Wait()
	})
}

// waitAll waits up to grace for every worker to exit, then kills the rest.
// The end of ctx cuts the wait short.
func (c *children) waitAll(ctx context.Context, grace time.Duration) {
	all := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(all)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-all:
	case <-timer.C:
	case <-ctx.Done():
	}
	c.killAll()
	<-all
}

// prefixWriter writes whole lines, each with a prefix, so the workers'
// logs can share one stream and stay readable. When keep is set, only the
// lines it keeps.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	keep   func(line []byte) bool
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		if p.keep == nil || p.keep(p.buf[:i]) {
			p.w.Write(append([]byte(p.prefix), p.buf[:i+1]...))
		}
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func (p *prefixWriter) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) > 0 && (p.keep == nil || p.keep(p.buf)) {
		p.w.Write(append(append([]byte(p.prefix), p.buf...), '\n'))
	}
	p.buf = nil
}

// lockedWriter serialises writes from many goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
