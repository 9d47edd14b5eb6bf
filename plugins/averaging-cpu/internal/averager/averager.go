// Package averager is the averaging-cpu plugin's Averager: it averages the
// arena's parameters with the other ranks through the coordinator's reduce
// server (core/reduceserver) over the data channel of shared/reduce.
//
// Ranks of one host never send parameters through a socket: each maps the
// others' arenas, and each reduces its own slice of the elements (in
// parallel, over the host's cores) straight from every arena into every
// arena. The server only runs the barrier: it collects each rank's weight,
// tells the host's ranks the plan, and gathers their divergence sums. When
// the cohort spans several hosts, each host's ranks fold their weighted sum
// into a host-shared segment that the host's leader sends to the server
// (f32 or bf16), and the consensus it gets back is applied the same way. So
// at most one stream per host crosses TCP.
package averager

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/reduce"
)

// Name is the plugin's name (binary cohort-averaging-cpu).
const Name = "cpu"

// Version is the plugin's version.
const Version = "0.1.0"

// ErrAborted is wrapped by the error of a round that Abort stopped, and of
// every Average after it until NewSession or Configure.
var ErrAborted = fmt.Errorf("%w by Abort", plugin.ErrRoundAborted)

// ErrRoundFailed is wrapped by the error of a round the reduce server
// failed for the whole cohort (a rank died or aborted in it, or the ranks
// disagreed); the next round may succeed.
var ErrRoundFailed = fmt.Errorf("%w: failed by the reduce server", plugin.ErrRoundAborted)

// Averager is the CPU averager. Average, Configure, Shutdown, SaveState and
// LoadState run one at a time; Abort, NewSessionID and Describe may run
// concurrently with them.
type Averager struct {
	log hclog.Logger

	opMu sync.Mutex
	c    *client // nil until Configure

	// mu guards the session and abort state.
	mu       sync.Mutex
	aborted  bool
	reason   string
	abortCh  chan struct{}
	inRound  bool
	roundID  uint64
	conn     *reduce.Conn
	members  []uint32
	sessGen  uint64
	shutdown bool
}

// New returns an unconfigured averager.
func New(log hclog.Logger) *Averager {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Averager{log: log, abortCh: make(chan struct{})}
}

var _ plugin.Averager = (*Averager)(nil)

// Describe names the plugin; its ranks meet at the coordinator's reduce
// server.
func (a *Averager) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: Name, Version: Version, Capabilities: []string{"shm-fold", "bf16-wire", "outer-slowmo", "outer-diloco", "easgd"},
		Meeting: plugin.MeetReduceServer, Settings: plugin.SchemaOf(Settings{})}, nil
}

// CheckSettings checks the block as Configure would, connecting to
// nothing.
func (a *Averager) CheckSettings(_ context.Context, settings json.RawMessage) ([]plugin.SettingProblem, error) {
	if _, err := parseSettings(settings); err != nil {
		return []plugin.SettingProblem{plugin.ProblemOf(err, plugin.SchemaOf(Settings{}))}, nil
	}
	return nil, nil
}

// Configure joins the cohort: it opens the arena, connects to the reduce
// server at cfg.Endpoint (retrying until connect_timeout), authenticates
// with keys derived from cfg.DataKey and announces where its arena lives.
// A second Configure replaces the first. It starts a new session: a
// previous Abort no longer applies.
func (a *Averager) Configure(ctx context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.c != nil {
		a.c.close()
		a.c = nil
	}
	c, err := newClient(ctx, a.log, cfg)
	if err != nil {
		return plugin.AveragerTraits{}, err
	}
	a.c = c
	a.mu.Lock()
	a.conn = c.conn
	a.members = nil
	a.sessGen = 0
	a.resetAbortLocked()
	a.mu.Unlock()
	return plugin.AveragerTraits{SoloIdentity: c.cfg.soloIdentity()}, nil
}

func (a *Averager) resetAbortLocked() {
	if a.aborted {
		a.abortCh = make(chan struct{})
	}
	a.aborted, a.reason = false, ""
}

// Average runs one round; it returns when the arena holds the result.
func (a *Averager) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if a.c == nil {
		return plugin.RoundResult{}, errors.New("averager: Average before Configure")
	}
	a.mu.Lock()
	if a.aborted {
		reason := a.reason
		a.mu.Unlock()
		return plugin.RoundResult{}, fmt.Errorf("averager: round %d: %w (%s); waiting for a new session", r.Round, ErrAborted, reason)
	}
	root := r.Root
	if r.Broadcast && a.members != nil {
		if int(r.Root) >= len(a.members) {
			a.mu.Unlock()
			return plugin.RoundResult{}, fmt.Errorf("averager: broadcast root %d is not a rank of session %d (%d members)", r.Root, a.sessGen, len(a.members))
		}
		root = a.members[r.Root]
	}
	sess := a.sessGen
	abortCh := a.abortCh
	a.inRound, a.roundID = true, r.Round
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inRound = false
		a.mu.Unlock()
	}()
	res, err := a.c.round(ctx, r, root, sess, abortCh, a.abortReason)
	if err != nil {
		return plugin.RoundResult{}, fmt.Errorf("averager: round %d: %w", r.Round, err)
	}
	return res, nil
}

func (a *Averager) abortReason() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reason
}

// NewSessionID returns 16 random bytes (the CPU backend needs no
// rendezvous; the ID only names the session).
func (a *Averager) NewSessionID(context.Context) ([]byte, error) {
	id := make([]byte, 16)
	_, err := rand.Read(id)
	return id, err
}

// NewSession adopts a new membership: a round of the old session still in
// flight is aborted, the averager leaves the aborted state, broadcast roots
// are read as indices into s.Members from now on, and the reduce server is
// told that ranks outside s.Members are gone.
func (a *Averager) NewSession(ctx context.Context, s plugin.Session) error {
	if len(s.Members) == 0 || int(s.NewRank) >= len(s.Members) || uint32(len(s.Members)) != s.NewWorldSize {
		return fmt.Errorf("averager: session %d: new rank %d, world %d and %d members do not agree", s.Generation, s.NewRank, s.NewWorldSize, len(s.Members))
	}
	a.abort("superseded by session " + fmt.Sprint(s.Generation))
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.c != nil && s.Members[s.NewRank] != a.c.rank {
		return fmt.Errorf("averager: session %d names global rank %d as new rank %d, this averager is rank %d", s.Generation, s.Members[s.NewRank], s.NewRank, a.c.rank)
	}
	a.members = append([]uint32(nil), s.Members...)
	a.sessGen = s.Generation
	a.resetAbortLocked()
	if a.conn != nil {
		if _, err := a.conn.SendAsync(reduce.KindSession, reduce.Session{Generation: s.Generation, Members: s.Members}.Encode()); err != nil {
			return fmt.Errorf("averager: session %d: tell the reduce server: %w", s.Generation, err)
		}
	}
	return nil
}

// Abort makes the in-flight round fail promptly, here and (through the
// reduce server) on every other rank, and keeps the averager aborted until
// NewSession or Configure. Idempotent; safe concurrently with Average.
func (a *Averager) Abort(_ context.Context, reason string) error {
	a.abort(reason)
	return nil
}

func (a *Averager) abort(reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.aborted {
		return
	}
	a.aborted, a.reason = true, reason
	close(a.abortCh)
	if a.inRound && a.conn != nil {
		// Best effort: the server fails the round for everyone, so no peer
		// waits on this rank.
		a.conn.SendAsync(reduce.KindAbort, reduce.Abort{Round: a.roundID, Reason: reason}.Encode())
	}
}

// Shutdown aborts a round in flight, says goodbye to the reduce server and
// releases the arena and the shared memory.
func (a *Averager) Shutdown(ctx context.Context) error {
	a.abort("averager shutting down")
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	a.conn = nil
	a.shutdown = true
	a.mu.Unlock()
	if a.c == nil {
		return nil
	}
	err := a.c.close()
	a.c = nil
	return err
}
