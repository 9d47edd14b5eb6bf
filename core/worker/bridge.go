package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cohortdl/cohort/core/resources"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Why a worker stops with an error because of its coordinator; Run's error
// wraps one of them.
var (
	// ErrLinkLost: the control connection broke before a clean Shutdown.
	ErrLinkLost = errors.New("coordinator link lost")
	// ErrCoordinatorSilent: no frame arrived within the liveness timeout.
	ErrCoordinatorSilent = errors.New("coordinator silent past the liveness timeout")
)

// errCleanStop is the stop cause when the coordinator sent Shutdown or
// ShutdownWithSave.
var errCleanStop = errors.New("coordinator asked for shutdown")

// sessionIDTimeout bounds the averager's NewSessionID call.
const sessionIDTimeout = 10 * time.Second

// inbound is the inbound bridge: the one goroutine that reads the
// connection. Any frame proves the coordinator alive (Receive's idle
// timeout is the liveness clock). Membership frames are handled here,
// because the main loop may be blocked in a round that only they can end.
func (w *worker) inbound(ctx context.Context) {
	clean := false // a Shutdown arrived: the EOF that follows is expected
	for {
		msg, err := w.conn.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return // teardown
			}
			if clean {
				w.log.Debug("control link closed after Shutdown", "reason", err)
				return
			}
			var cause error
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				cause = fmt.Errorf("%w (%v): %w", ErrCoordinatorSilent, w.o.LivenessTimeout, err)
			case errors.Is(err, io.EOF):
				cause = fmt.Errorf("%w: the coordinator closed the connection before Shutdown", ErrLinkLost)
			default:
				cause = fmt.Errorf("%w: %w", ErrLinkLost, err)
			}
			w.linkFailed(cause)
			return
		}
		switch m := msg.(type) {
		case *wirepb.CoordinatorHeartbeat:
			// Only proof of life, which Receive already counted.
		case *wirepb.DeclareDead:
			news, err := w.ledger.mark(m.GetRank())
			switch {
			case err != nil:
				w.log.Warn("ignoring DeclareDead", "error", err)
			case news:
				w.log.Info("peer declared dead", "peer", m.GetRank(), "reason", m.GetReason())
			}
		case *wirepb.NewSession:
			w.mailbox.put(plugin.Session{
				Generation:   m.GetGeneration(),
				ID:           m.GetSessionId(),
				NewRank:      m.GetNewRank(),
				NewWorldSize: m.GetNewWorldSize(),
				Members:      m.GetMembers(),
			})
			w.log.Info("new averaging session received", "generation", m.GetGeneration(), "members", m.GetMembers())
		case *wirepb.RequestSessionId:
			w.answerSessionID(ctx, m.GetGeneration())
		case *wirepb.Meeting:
			w.relay.deliverMeeting(m)
		case *wirepb.RelayResult:
			if !w.relay.deliver(m) {
				w.log.Debug("relay result nobody waits for", "key", m.GetKey())
			}
		case *wirepb.Admit:
			w.log.Warn("ignoring a second Admit")
		case *wirepb.Shutdown, *wirepb.ShutdownWithSave:
			clean = true
			w.queue.push(command{msg: msg})
			// Interrupts a plan in training (or the setup); the main loop
			// then finds the command.
			w.stop(errCleanStop)
		default:
			w.queue.push(command{msg: msg})
		}
	}
}

// linkFailed ends the worker on a lost coordinator: every peer is marked
// dead so the watchdog aborts a round in flight, and an error stop is
// queued for the main loop.
func (w *worker) linkFailed(cause error) {
	w.log.Error("lost the coordinator", "error", cause)
	w.ledger.markAllExcept(w.o.Rank)
	w.queue.push(command{err: cause})
	w.stop(cause)
}

// answerSessionID has the averager make a session id and sends it.
func (w *worker) answerSessionID(ctx context.Context, gen uint64) {
	avg := w.sup.ConfiguredAverager()
	if avg == nil {
		w.log.Warn("RequestSessionId before the averager is configured: not answered", "generation", gen)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, sessionIDTimeout)
	defer cancel()
	id, err := avg.NewSessionID(sctx)
	if err != nil {
		w.log.Error("averager could not make a session id: not answered", "generation", gen, "error", err)
		return
	}
	if err := w.conn.Send(ctx, &wirepb.SessionIdGenerated{Rank: w.o.Rank, Generation: gen, SessionId: id}); err != nil {
		w.log.Warn("send SessionIdGenerated", "error", err)
	}
}

// heartbeat sends Heartbeat every HeartbeatInterval.
func (w *worker) heartbeat(ctx context.Context) {
	t := time.NewTicker(w.o.HeartbeatInterval)
	defer t.Stop()
	var counter uint64
	for {
		counter++
		if err := w.conn.Send(ctx, &wirepb.Heartbeat{Rank: w.o.Rank, Counter: counter}); err != nil && ctx.Err() == nil {
			w.log.Debug("send Heartbeat", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleResources sends a ResourceSample every ResourceInterval and keeps
// the latest for the next Metrics.
func (w *worker) sampleResources(ctx context.Context, s *resources.Sampler) {
	t := time.NewTicker(w.o.ResourceInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rs := w.resourceSample(s.Sample(), s.SampleProcesses(w.processes()))
		w.lastSample.Store(rs)
		if err := w.conn.Send(ctx, rs); err != nil && ctx.Err() == nil {
			w.log.Debug("send ResourceSample", "error", err)
		}
	}
}

// processes lists what a resource sample covers: this core, then each
// plugin process still running (none for in-process plugins, whose use is
// the core's).
func (w *worker) processes() []resources.Process {
	ps := []resources.Process{{Role: "worker", PID: os.Getpid()}}
	if h, ok := w.plugins.(*HostPlugins); ok {
		for _, p := range h.Processes() {
			if pid := p.Pid(); pid > 0 && !p.Exited() {
				ps = append(ps, resources.Process{Role: string(p.Kind), Name: p.Name, PID: pid})
			}
		}
	}
	return ps
}

func (w *worker) resourceSample(s resources.Sample, procs []resources.ProcessUse) *wirepb.ResourceSample {
	rs := &wirepb.ResourceSample{
		Rank:          w.o.Rank,
		CpuPercent:    s.CPUPercent,
		RamUsedBytes:  s.RAMUsed,
		RamTotalBytes: s.RAMTotal,
		RssBytes:      s.RSS,
		UnixNanos:     s.Time.UnixNano(),
	}
	for _, p := range procs {
		rs.Processes = append(rs.Processes, &wirepb.ProcessSample{
			Role:       p.Role,
			Name:       p.Name,
			Pid:        int32(p.PID),
			CpuPercent: p.CPUPercent,
			RssBytes:   p.RSS,
		})
	}
	for _, g := range s.GPUs {
		rs.Gpus = append(rs.Gpus, &wirepb.GpuSample{
			Index:            g.Index,
			Name:             g.Name,
			UtilPercent:      g.UtilPercent,
			MemoryUsedBytes:  g.MemUsed,
			MemoryTotalBytes: g.MemTotal,
		})
	}
	return rs
}
