package plugintest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// AveragerName is the name the mock averager describes itself with.
const AveragerName = "mock"

// ErrAborted is wrapped by the error of a round that Abort, NewSession or
// Shutdown stopped, and of every round of an aborted session.
var ErrAborted = plugin.ErrRoundAborted

// Averager is the mock averager: a step-weighted average across the ranks,
// through the relay (AveragerConfig.Relay) and nothing else, so it runs
// wherever the ranks reach their coordinator, across hosts too. It suits
// the small models of tests: every rank receives every rank's parameters.
//
// Round r posts this rank's contribution under a key naming the session
// and the round, receives every live member's, and computes on every rank,
// in member order and in
// float64, Σ wᵢxᵢ / Σ wᵢ for parameters with wᵢ = stepsᵢ^gamma (0 for no
// steps), and the plain mean among ranks of weight above 0 for buffers; so
// the result is bitwise the same everywhere. When Σ wᵢ is 0 every rank keeps
// its values. A broadcast round copies Round.Root's values, Root being a
// rank of the current session (an index into Session.Members; before any
// NewSession, the global rank). Only f32 entries are averaged; others stay
// local. PreNorm and PostNorm are L2 norms over the parameter entries and
// Divergence is |pre-post| / |post| (|pre-post| when |post| is 0).
//
// A member that died before posting weighs nothing; a broadcast whose root
// did not post fails as aborted. A contribution of another round, session
// or layout is an error.
//
// Abort fails the in-flight round at once, and the averager stays aborted
// (every Average fails with ErrAborted) until NewSession or Configure starts
// a new session. NewSession also aborts a round of the old session still in
// flight. One Average runs at a time.
type Averager struct {
	logger hclog.Logger

	// roundMu is held by Average for a whole round, and by Configure and
	// Shutdown while they change what a round uses: the fields below down
	// to mu.
	roundMu sync.Mutex
	relay   plugin.Relay
	gamma   float64
	sleep   time.Duration // before each round's exchange (sleep_per_round)
	copies  uint64        // reported per realized round (host_copy_bytes)
	mapping *arena.Mapping
	floats  []int // layout indices of f32 entries
	count   int   // f32 values in all of them
	digest  [32]byte
	buf     []byte    // this rank's contribution: header and values
	pre     []byte    // this rank's values before the round
	peer    []float32 // a peer's values
	acc     []float64 // the reduction

	// mu guards the session state.
	mu          sync.Mutex
	configured  bool
	rank        uint32 // global rank
	members     []uint32
	gen         uint64
	sessionHash uint64
	abort       *abortState
}

// abortState is one session's abort: done is closed, once, when reason is
// set. reason is guarded by Averager.mu.
type abortState struct {
	done   chan struct{}
	reason string
}

func newAbortState() *abortState { return &abortState{done: make(chan struct{})} }

// why is the abort's reason.
func (a *Averager) why(st *abortState) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return st.reason
}

var _ plugin.Averager = (*Averager)(nil)

// NewAverager makes an unconfigured mock averager; logger may be nil.
func NewAverager(logger hclog.Logger) *Averager {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Averager{logger: logger, abort: newAbortState()}
}

// Describe names the mock.
func (a *Averager) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: AveragerName, Version: "1", Capabilities: []string{"cpu"}, Meeting: plugin.MeetRelay,
		Settings: plugin.SchemaOf(AveragerSettings{})}, nil
}

func hash64(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// Configure maps the arena and starts session generation 0 with members
// 0..WorldSize-1.
func (a *Averager) Configure(_ context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return plugin.AveragerTraits{}, fmt.Errorf("mock averager: rank %d of a world of %d", cfg.Rank, cfg.WorldSize)
	}
	if cfg.Relay == nil {
		return plugin.AveragerTraits{}, errors.New("mock averager: no relay: the host must offer one (AveragerConfig.Relay)")
	}
	s, err := parseAveragerSettings(cfg.Settings)
	if err != nil {
		return plugin.AveragerTraits{}, err
	}
	var floats []int
	count := 0
	for i, e := range cfg.Arena.Layout.Entries {
		if e.DType == arena.F32 {
			floats = append(floats, i)
			count += int(e.Bytes / 4)
		}
	}
	m, err := arena.Open(cfg.Arena)
	if err != nil {
		return plugin.AveragerTraits{}, fmt.Errorf("mock averager: %w", err)
	}

	a.roundMu.Lock()
	defer a.roundMu.Unlock()
	if a.mapping != nil {
		if err := a.mapping.Close(); err != nil {
			a.logger.Warn("closing the previous arena", "error", err)
		}
	}
	sleep, _ := s.roundSleep() // checked by parseAveragerSettings
	a.relay, a.gamma, a.sleep, a.copies = cfg.Relay, s.Gamma, sleep, s.HostCopyBytes
	a.mapping, a.floats, a.count, a.digest = m, floats, count, cfg.Arena.Layout.Digest()
	a.buf = make([]byte, contribHeader+4*count)
	a.pre = make([]byte, 4*count)
	a.peer = make([]float32, count)
	a.acc = make([]float64, count)

	members := make([]uint32, cfg.WorldSize)
	for i := range members {
		members[i] = uint32(i)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.configured, a.rank, a.members, a.gen, a.sessionHash = true, cfg.Rank, members, 0, hash64(nil)
	a.renewAbortLocked("reconfigured")
	a.logger.Debug("configured", "rank", cfg.Rank, "world", cfg.WorldSize, "floats", count)
	return plugin.AveragerTraits{SoloIdentity: !s.LoneRounds}, nil
}

// renewAbortLocked aborts the current session's rounds and starts a new,
// unaborted abort channel.
func (a *Averager) renewAbortLocked(reason string) {
	a.abortLocked(reason)
	a.abort = newAbortState()
}

func (a *Averager) abortLocked(reason string) {
	select {
	case <-a.abort.done:
	default:
		a.abort.reason = reason
		close(a.abort.done)
	}
}

// Abort fails the in-flight round and every later one until a new session.
func (a *Averager) Abort(_ context.Context, reason string) error {
	if reason == "" {
		reason = "no reason given"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.abortLocked(reason)
	a.logger.Debug("aborted", "reason", reason)
	return nil
}

// NewSessionID returns 16 random bytes.
func (a *Averager) NewSessionID(context.Context) ([]byte, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("mock averager: session id: %w", err)
	}
	return id, nil
}

// NewSession makes s.Members (global ranks) the group of later rounds. This
// rank must be s.Members[s.NewRank].
func (a *Averager) NewSession(_ context.Context, s plugin.Session) error {
	if int(s.NewWorldSize) != len(s.Members) || s.NewRank >= s.NewWorldSize {
		return fmt.Errorf("mock averager: session of %d members with new rank %d and world size %d", len(s.Members), s.NewRank, s.NewWorldSize)
	}
	seen := make(map[uint32]bool, len(s.Members))
	for _, m := range s.Members {
		if seen[m] {
			return fmt.Errorf("mock averager: rank %d is listed twice in the session's members", m)
		}
		seen[m] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.configured {
		return errors.New("mock averager: NewSession before Configure")
	}
	if s.Members[s.NewRank] != a.rank {
		return fmt.Errorf("mock averager: session member %d is rank %d, but this is rank %d", s.NewRank, s.Members[s.NewRank], a.rank)
	}
	a.members = append([]uint32(nil), s.Members...)
	a.gen, a.sessionHash = s.Generation, hash64(s.ID)
	a.renewAbortLocked("superseded by a new session")
	a.logger.Debug("new session", "generation", s.Generation, "members", s.Members)
	return nil
}

// SaveState writes nothing: the mock averager keeps no state between
// rounds that a checkpoint would need.
func (a *Averager) SaveState(context.Context, string) ([]string, error) { return nil, nil }

// LoadState has nothing to restore.
func (a *Averager) LoadState(context.Context, string) error { return nil }

// Shutdown aborts any round in flight, waits for it to end and unmaps the
// arena. The averager must be configured again before further use.
func (a *Averager) Shutdown(context.Context) error {
	a.mu.Lock()
	a.abortLocked("shut down")
	a.configured = false
	a.mu.Unlock()

	a.roundMu.Lock()
	defer a.roundMu.Unlock()
	var err error
	if a.mapping != nil {
		err = a.mapping.Close()
		a.mapping = nil
	}
	a.buf, a.pre, a.peer, a.acc, a.relay = nil, nil, nil, nil, nil
	return err
}

// session is what one round uses of the session state.
type session struct {
	rank    uint32
	members []uint32
	me      int
	gen     uint64
	hash    uint64
	abort   *abortState
}

// Average runs one round; see Averager.
func (a *Averager) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	if !a.roundMu.TryLock() {
		return plugin.RoundResult{}, fmt.Errorf("mock averager: round %d: another round is in flight", r.Round)
	}
	defer a.roundMu.Unlock()
	start := time.Now()
	fail := func(err error) (plugin.RoundResult, error) {
		return plugin.RoundResult{}, fmt.Errorf("mock averager: round %d: %w", r.Round, err)
	}

	a.mu.Lock()
	s := session{rank: a.rank, members: a.members, me: -1, gen: a.gen, hash: a.sessionHash, abort: a.abort}
	configured := a.configured
	a.mu.Unlock()
	if !configured || a.mapping == nil {
		return fail(errors.New("not configured"))
	}
	select {
	case <-s.abort.done:
		return fail(fmt.Errorf("%w: %s", ErrAborted, a.why(s.abort)))
	default:
	}
	for i, m := range s.members {
		if m == s.rank {
			s.me = i
		}
	}
	if s.me < 0 {
		return fail(fmt.Errorf("rank %d is not a member of the session", s.rank))
	}
	if a.sleep > 0 {
		select {
		case <-time.After(a.sleep):
		case <-s.abort.done:
			return fail(fmt.Errorf("%w: %s", ErrAborted, a.why(s.abort)))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	if r.Broadcast && int(r.Root) >= len(s.members) {
		return fail(fmt.Errorf("broadcast root %d is not a rank of a session of %d", r.Root, len(s.members)))
	}
	weight := 0.0
	if r.Steps > 0 {
		weight = math.Pow(float64(r.Steps), a.gamma)
		if math.IsInf(weight, 0) {
			return fail(fmt.Errorf("weight %d^%v overflows", r.Steps, a.gamma))
		}
	}

	// This rank's contribution: the arena's f32 values as they are now.
	pre := arena.AsFloat32s(a.pre)
	off := 0
	for _, i := range a.floats {
		t, err := a.mapping.Float32s(i)
		if err != nil {
			return fail(err)
		}
		off += copy(pre[off:], t)
	}
	mine := contribution{round: r.Round, gen: s.gen, session: s.hash, rank: s.rank,
		steps: r.Steps, weight: weight, digest: a.digest, count: uint64(a.count)}
	mine.encode(a.buf)
	for k, v := range pre {
		binary.LittleEndian.PutUint32(a.buf[contribHeader+4*k:], math.Float32bits(v))
	}

	waitStart := time.Now()
	posted, err := a.exchange(ctx, r.Round, s)
	if err != nil {
		return fail(err)
	}
	moved := uint64(len(a.buf))
	// peers[i] is session member i's contribution; missing, it died
	// before posting and weighs nothing.
	peers := make([]contribution, len(s.members))
	blobs := make([][]byte, len(s.members))
	for i, m := range s.members {
		blob, ok := posted[m]
		if !ok {
			continue
		}
		c, err := a.checkContribution(blob, r.Round, m, s)
		if err != nil {
			return fail(err)
		}
		peers[i], blobs[i] = c, blob
		if i != s.me {
			moved += uint64(len(blob))
		}
	}
	reduceStart := time.Now()
	res := plugin.RoundResult{Weight: weight, WaitMS: plugin.Milliseconds(reduceStart.Sub(waitStart))}
	var total float64
	nonzero := 0
	for _, p := range peers {
		total += p.weight
		if p.weight > 0 {
			nonzero++
		}
	}
	res.TotalWeight = total

	// src holds the root's values in a broadcast from another rank; in an
	// average, a.acc holds the sums. Neither: the local values stay.
	var src []float32
	average := false
	switch {
	case r.Broadcast:
		res.Realized = true
		if int(r.Root) == s.me {
			break
		}
		if blobs[r.Root] == nil {
			return fail(fmt.Errorf("%w: broadcast root %d (rank %d) posted nothing", ErrAborted, r.Root, s.members[r.Root]))
		}
		src = a.values(blobs[r.Root])
	case total > 0:
		res.Realized, average = true, true
		clear(a.acc)
		for i, p := range peers {
			if p.weight == 0 {
				continue
			}
			vals := pre
			if i != s.me {
				vals = a.values(blobs[i])
			}
			a.accumulate(vals, p.weight)
		}
	}

	// Write the result in place and measure over the parameters.
	var preSq, postSq, diffSq float64
	entries := a.mapping.Layout().Entries
	off = 0
	for _, i := range a.floats {
		t, err := a.mapping.Float32s(i)
		if err != nil {
			return fail(err)
		}
		param := entries[i].Role == arena.Parameter
		div := float64(nonzero)
		if param {
			div = total
		}
		for j := range t {
			k := off + j
			switch {
			case src != nil:
				t[j] = src[k]
			case average:
				t[j] = float32(a.acc[k] / div)
			}
			if param {
				x, y := float64(pre[k]), float64(t[j])
				preSq += x * x
				postSq += y * y
				diffSq += (x - y) * (x - y)
			}
		}
		off += len(t)
	}
	res.PreNorm, res.PostNorm = math.Sqrt(preSq), math.Sqrt(postSq)
	res.Divergence = math.Sqrt(diffSq)
	if res.PostNorm > 0 {
		res.Divergence /= res.PostNorm
	}
	res.BytesMoved, res.HostCopyBytes = moved, a.copies
	end := time.Now()
	res.ReduceMS, res.TotalMS = plugin.Milliseconds(end.Sub(reduceStart)), plugin.Milliseconds(end.Sub(start))
	return res, nil
}

// accumulate adds coefficient·vals to the reduction: the weight for
// parameters, 1 for buffers (callers skip ranks of weight 0).
func (a *Averager) accumulate(vals []float32, weight float64) {
	off := 0
	entries := a.mapping.Layout().Entries
	for _, i := range a.floats {
		e := entries[i]
		n := int(e.Bytes / 4)
		acc, v := a.acc[off:off+n], vals[off:off+n]
		if e.Role == arena.Parameter {
			for j, x := range v {
				acc[j] += weight * float64(x)
			}
		} else {
			for j, x := range v {
				acc[j] += float64(x)
			}
		}
		off += n
	}
}
