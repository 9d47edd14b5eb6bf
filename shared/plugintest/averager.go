package plugintest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
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

// A contribution file: this header, then the raw little-endian values of
// every f32 entry of the layout, in layout order.
//
//	0  magic "COHMAVG1"     8  round u64        16 generation u64
//	24 session-ID hash u64  32 run-ID hash u64  40 global rank u32
//	44 reserved u32         48 steps u64        56 weight f64
//	64 layout digest [32]   96 value count u64  104 values
const (
	contribMagic  = "COHMAVG1"
	contribHeader = 104
)

// contribution is a parsed contribution header.
type contribution struct {
	round, gen, session, run uint64
	rank                     uint32
	steps                    uint64
	weight                   float64
	digest                   [32]byte
	count                    uint64
}

func (c *contribution) encode(b []byte) {
	copy(b, contribMagic)
	le := binary.LittleEndian
	le.PutUint64(b[8:], c.round)
	le.PutUint64(b[16:], c.gen)
	le.PutUint64(b[24:], c.session)
	le.PutUint64(b[32:], c.run)
	le.PutUint32(b[40:], c.rank)
	le.PutUint32(b[44:], 0)
	le.PutUint64(b[48:], c.steps)
	le.PutUint64(b[56:], math.Float64bits(c.weight))
	copy(b[64:96], c.digest[:])
	le.PutUint64(b[96:], c.count)
}

func decodeContribution(b []byte) (contribution, error) {
	if len(b) < contribHeader {
		return contribution{}, fmt.Errorf("%d bytes, shorter than the %d-byte header", len(b), contribHeader)
	}
	if string(b[:8]) != contribMagic {
		return contribution{}, errors.New("not a mock averager contribution (bad magic)")
	}
	le := binary.LittleEndian
	c := contribution{
		round:   le.Uint64(b[8:]),
		gen:     le.Uint64(b[16:]),
		session: le.Uint64(b[24:]),
		run:     le.Uint64(b[32:]),
		rank:    le.Uint32(b[40:]),
		steps:   le.Uint64(b[48:]),
		weight:  math.Float64frombits(le.Uint64(b[56:])),
		count:   le.Uint64(b[96:]),
	}
	copy(c.digest[:], b[64:96])
	return c, nil
}

// Averager is the mock averager: a step-weighted average across the ranks
// of one host, through files in a shared directory (AveragerConfig.Endpoint),
// with no coordinator.
//
// Round r writes this rank's contribution to <dir>/round-<r>/rank-<global
// rank> (temp file and rename), waits until every member of the session has
// written its own, and computes on every rank, in member order and in
// float64, Σ wᵢxᵢ / Σ wᵢ for parameters with wᵢ = stepsᵢ^gamma (0 for no
// steps), and the plain mean among ranks of weight above 0 for buffers; so
// the result is bitwise the same everywhere. When Σ wᵢ is 0 every rank keeps
// its values. A broadcast round copies Round.Root's values, Root being a
// rank of the current session (an index into Session.Members; before any
// NewSession, the global rank). Only f32 entries are averaged; others stay
// local. PreNorm and PostNorm are L2 norms over the parameter entries and
// Divergence is |pre-post| / |post| (|pre-post| when |post| is 0).
//
// A file of another run, session generation or session ID counts as not yet
// written; a file of this session that does not match the layout is an
// error. At the start of round r the rank deletes its file of round r-2,
// which every member has read by then. Files of the last two rounds stay.
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
	dir     string
	gamma   float64
	poll    time.Duration
	runHash uint64
	mapping *arena.Mapping
	floats  []int // layout indices of f32 entries
	count   int   // f32 values in all of them
	digest  [32]byte
	buf     []byte    // this rank's contribution: header and values
	peer    []byte    // a peer's values
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
	return plugin.Description{Name: AveragerName, Version: "1", Capabilities: []string{"cpu", "shared-directory"}}, nil
}

func hash64(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// Configure maps the arena, creates the rendezvous directory when missing
// and starts session generation 0 with members 0..WorldSize-1.
func (a *Averager) Configure(_ context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return plugin.AveragerTraits{}, fmt.Errorf("mock averager: rank %d of a world of %d", cfg.Rank, cfg.WorldSize)
	}
	if cfg.Endpoint == "" {
		return plugin.AveragerTraits{}, errors.New("mock averager: no endpoint: it must be the rendezvous directory")
	}
	s, poll, err := parseAveragerSettings(cfg.Settings)
	if err != nil {
		return plugin.AveragerTraits{}, err
	}
	if err := os.MkdirAll(cfg.Endpoint, 0o700); err != nil {
		return plugin.AveragerTraits{}, fmt.Errorf("mock averager: rendezvous directory: %w", err)
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
	a.dir, a.gamma, a.poll, a.runHash = cfg.Endpoint, s.Gamma, poll, hash64([]byte(cfg.RunID))
	a.mapping, a.floats, a.count, a.digest = m, floats, count, cfg.Arena.Layout.Digest()
	a.buf = make([]byte, contribHeader+4*count)
	a.peer = nil
	a.acc = make([]float64, count)

	members := make([]uint32, cfg.WorldSize)
	for i := range members {
		members[i] = uint32(i)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.configured, a.rank, a.members, a.gen, a.sessionHash = true, cfg.Rank, members, 0, hash64(nil)
	a.renewAbortLocked("reconfigured")
	a.logger.Debug("configured", "rank", cfg.Rank, "world", cfg.WorldSize, "dir", cfg.Endpoint, "floats", count)
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
	a.buf, a.peer, a.acc = nil, nil, nil
	return err
}

func (a *Averager) roundDir(r uint64) string {
	return filepath.Join(a.dir, "round-"+strconv.FormatUint(r, 10))
}

func (a *Averager) rankFile(r uint64, rank uint32) string {
	return filepath.Join(a.roundDir(r), "rank-"+strconv.FormatUint(uint64(rank), 10))
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

	if r.Round >= 2 {
		old := a.rankFile(r.Round-2, s.rank)
		if err := os.Remove(old); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.logger.Warn("removing an old contribution", "path", old, "error", err)
		}
		// Gone only once every member removed its own.
		_ = os.Remove(a.roundDir(r.Round - 2))
	}

	// This rank's contribution: the arena's f32 values as they are now.
	pre := arena.AsFloat32s(a.buf[contribHeader:])
	off := 0
	for _, i := range a.floats {
		t, err := a.mapping.Float32s(i)
		if err != nil {
			return fail(err)
		}
		off += copy(pre[off:], t)
	}
	mine := contribution{round: r.Round, gen: s.gen, session: s.hash, run: a.runHash, rank: s.rank,
		steps: r.Steps, weight: weight, digest: a.digest, count: uint64(a.count)}
	mine.encode(a.buf)
	if err := a.writeContribution(r.Round, s.rank); err != nil {
		return fail(err)
	}
	moved := uint64(len(a.buf))

	waitStart := time.Now()
	peers, err := a.waitPeers(ctx, r.Round, s)
	if err != nil {
		return fail(err)
	}
	peers[s.me] = mine
	reduceStart := time.Now()
	res := plugin.RoundResult{Weight: weight, WaitMS: ms(reduceStart.Sub(waitStart))}
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
		vals, n, err := a.readValues(r.Round, s.members[r.Root], peers[r.Root])
		moved += n
		if err != nil {
			return fail(err)
		}
		src = vals
	case total > 0:
		res.Realized, average = true, true
		clear(a.acc)
		for i, p := range peers {
			if p.weight == 0 {
				continue
			}
			vals := pre
			if i != s.me {
				var n uint64
				vals, n, err = a.readValues(r.Round, s.members[i], p)
				moved += n
				if err != nil {
					return fail(err)
				}
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
	res.BytesMoved = moved
	end := time.Now()
	res.ReduceMS, res.TotalMS = ms(end.Sub(reduceStart)), ms(end.Sub(start))
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

// writeContribution publishes a.buf as this rank's file of round r.
func (a *Averager) writeContribution(r uint64, rank uint32) (err error) {
	dir := a.roundDir(r)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("rendezvous directory: %w", err)
	}
	f, err := os.CreateTemp(dir, "rank-"+strconv.FormatUint(uint64(rank), 10)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write contribution: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(a.buf); err != nil {
		return fmt.Errorf("write contribution: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("write contribution: %w", err)
	}
	if err = os.Rename(f.Name(), a.rankFile(r, rank)); err != nil {
		return fmt.Errorf("write contribution: %w", err)
	}
	return nil
}

// waitPeers polls until every other member's contribution to round r is
// there, returning the headers in member order (this rank's slot empty).
func (a *Averager) waitPeers(ctx context.Context, r uint64, s session) ([]contribution, error) {
	peers := make([]contribution, len(s.members))
	ready := make([]bool, len(s.members))
	ready[s.me] = true
	left := len(s.members) - 1
	var timer *time.Timer
	for {
		for i, m := range s.members {
			if ready[i] {
				continue
			}
			c, ok, err := a.peek(r, m, s)
			if err != nil {
				return nil, err
			}
			if ok {
				peers[i], ready[i] = c, true
				left--
			}
		}
		if left == 0 {
			return peers, nil
		}
		if timer == nil {
			timer = time.NewTimer(a.poll)
			defer timer.Stop()
		} else {
			timer.Reset(a.poll)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d of %d ranks: %w", left, len(s.members), ctx.Err())
		case <-s.abort.done:
			return nil, fmt.Errorf("waiting for %d of %d ranks: %w: %s", left, len(s.members), ErrAborted, a.why(s.abort))
		case <-timer.C:
		}
	}
}

// peek reads and checks the header of rank's file of round r. ok is false
// while there is no file of this session; a file of this session that does
// not fit the layout is an error.
func (a *Averager) peek(r uint64, rank uint32, s session) (c contribution, ok bool, err error) {
	path := a.rankFile(r, rank)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return contribution{}, false, nil
	}
	if err != nil {
		return contribution{}, false, err
	}
	defer f.Close()
	c, ok, err = a.checkHeader(f, path, r, rank, s.gen, s.hash)
	return c, ok, err
}

// checkHeader reads f's header and checks it against the round and layout.
func (a *Averager) checkHeader(f *os.File, path string, r uint64, rank uint32, gen, hash uint64) (contribution, bool, error) {
	var h [contribHeader]byte
	n, err := io.ReadFull(f, h[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return contribution{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	c, err := decodeContribution(h[:n])
	if err != nil {
		return contribution{}, false, fmt.Errorf("%s: %w", path, err)
	}
	if c.run != a.runHash || c.gen != gen || c.session != hash {
		return contribution{}, false, nil // another run's or session's
	}
	st, err := f.Stat()
	if err != nil {
		return contribution{}, false, err
	}
	switch {
	case c.round != r || c.rank != rank:
		return contribution{}, false, fmt.Errorf("%s: holds round %d of rank %d", path, c.round, c.rank)
	case c.digest != a.digest:
		return contribution{}, false, fmt.Errorf("%s: written for a different layout", path)
	case c.count != uint64(a.count):
		return contribution{}, false, fmt.Errorf("%s: holds %d values, the layout has %d", path, c.count, a.count)
	case st.Size() != int64(contribHeader+4*a.count):
		return contribution{}, false, fmt.Errorf("%s: %d bytes, want %d", path, st.Size(), contribHeader+4*a.count)
	case !(c.weight >= 0) || math.IsInf(c.weight, 0):
		return contribution{}, false, fmt.Errorf("%s: weight %v", path, c.weight)
	}
	return c, true, nil
}

// readValues reads the values of rank's file of round r, whose header was
// h, checking that the file is still that one. n is the bytes read.
func (a *Averager) readValues(r uint64, rank uint32, h contribution) (vals []float32, n uint64, err error) {
	path := a.rankFile(r, rank)
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	c, ok, err := a.checkHeader(f, path, r, rank, h.gen, h.session)
	if err != nil {
		return nil, contribHeader, err
	}
	if !ok || c != h {
		return nil, contribHeader, fmt.Errorf("%s: replaced during the round", path)
	}
	if a.peer == nil {
		a.peer = make([]byte, 4*a.count)
	}
	if _, err := io.ReadFull(f, a.peer); err != nil {
		return nil, contribHeader, fmt.Errorf("read %s: %w", path, err)
	}
	return arena.AsFloat32s(a.peer), uint64(contribHeader + len(a.peer)), nil
}
