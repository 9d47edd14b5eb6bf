package main

// The processes a row starts in the bed's hosts, and the hosts' byte
// counters around them.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/bench/internal/netns"
)

// proc is one started process: with its process group, killed when the
// bench's context ends or the bench itself dies (Pdeathsig survives the
// exec chain ip netns exec → unshare → sh → the program, each exec'ing the
// next).
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// syncBuffer is a buffer the process's stdout and stderr both write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start starts cmd; verbose passes its output to stderr too.
func start(ctx context.Context, cmd *exec.Cmd, env []string, verbose bool) (*proc, error) {
	p := &proc{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	var w io.Writer = p.out
	if verbose {
		w = io.MultiWriter(p.out, os.Stderr)
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	go func() {
		select {
		case <-ctx.Done():
			p.kill()
		case <-p.done:
		}
	}()
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) kill() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) }

// wait waits up to d for the process, killing it after; it returns the
// process's error, or one saying it was killed.
func (p *proc) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
	case <-ctx.Done():
	}
	p.kill()
	<-p.done
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("still running after %v", d)
}

// failure says which command failed and how, with its output's end.
func (p *proc) failure(err error) error {
	return fmt.Errorf("%s: %w\n%s", strings.Join(p.cmd.Args, " "), err, tail(p.out.String(), 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// txBytes is every host's eth0 tx_bytes now.
func txBytes(bed *netns.Bed) ([]uint64, error) {
	out := make([]uint64, len(bed.Hosts))
	for i := range bed.Hosts {
		n, err := bed.TxBytes(i)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// meanSent is the mean over hosts of what each sent between two counts,
// divided by per (epochs, or a fraction of one).
func meanSent(before, after []uint64, per float64) float64 {
	var sum float64
	for i := range before {
		sum += float64(after[i] - before[i])
	}
	return sum / float64(len(before)) / per
}
