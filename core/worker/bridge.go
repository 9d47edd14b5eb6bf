package worker

import (
	"context"
	"errors"
	"os"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cohortdl/cohort/core/resources"
	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/core/worker/link"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Why a worker stops with an error because of its coordinator; Run's error
// wraps one of them. They are core/worker/link's.
var (
	// ErrLinkLost: the control connection broke before a clean Shutdown.
	ErrLinkLost = link.ErrLinkLost
	// ErrCoordinatorSilent: no frame arrived within the liveness timeout.
	ErrCoordinatorSilent = link.ErrCoordinatorSilent
)

// errCleanStop is the stop cause when the coordinator sent Shutdown or
// ShutdownWithSave.
var errCleanStop = errors.New("coordinator asked for shutdown")

// sessionIDTimeout bounds the averager's NewSessionID call.
const sessionIDTimeout = 10 * time.Second

// bridge is the inbound bridge: what the link's reading goroutine hands
// over (link.Handler). Membership frames are handled here, because the
// main loop may be blocked in a round that only they can end; the rest
// queue for the main loop.
type bridge struct{ w *worker }

var _ link.Handler = bridge{}

func (b bridge) PeerDead(rank uint32, reason string) {
	news, err := b.w.ledger.mark(rank)
	switch {
	case err != nil:
		b.w.log.Warn("ignoring DeclareDead", "error", err)
	case news:
		b.w.log.Info("peer declared dead", "peer", rank, "reason", reason)
	}
}

func (b bridge) NewSession(s plugin.Session) {
	b.w.mailbox.put(s)
	b.w.log.Info("new averaging session received", "generation", s.Generation, "members", s.Members)
}

// SessionIDRequested has the averager make a session id and sends it.
func (b bridge) SessionIDRequested(ctx context.Context, gen uint64) {
	w := b.w
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
	if err := w.link.Send(ctx, &wirepb.SessionIdGenerated{Rank: w.o.Rank, Generation: gen, SessionId: id}); err != nil {
		w.log.Warn("send SessionIdGenerated", "error", err)
	}
}

func (b bridge) Command(msg proto.Message) {
	b.w.queue.push(command{msg: msg})
	if isShutdown(msg) || isShutdownWithSave(msg) {
		// Interrupts a plan in training (or the setup); the main loop
		// then finds the command.
		b.w.stop(errCleanStop)
	}
}

// Lost handles a lost coordinator: every peer is marked dead so the
// watchdog aborts a round in flight, and an error is queued for the main
// loop. While the rank serves, only the link's context ends (the plan
// under way stops) and the main loop waits for a coordinator to come
// back (comeback.go); before, the worker stops.
func (b bridge) Lost(cause error) {
	w := b.w
	w.ledger.markAllExcept(w.o.Rank)
	w.queue.push(command{err: cause})
	if w.serving.Load() {
		w.connLost(cause)
		return
	}
	w.log.Error("lost the coordinator", "error", cause)
	w.stop(cause)
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
		if err := w.link.Send(ctx, rs); err != nil && ctx.Err() == nil {
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
