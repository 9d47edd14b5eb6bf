// Package trimmedmean is a cohort averager that is robust to a bad rank: a
// round replaces every coordinate of the parameters with the trimmed mean
// of that coordinate over the ranks that trained, dropping the Trim
// highest and the Trim lowest values first. Up to Trim ranks holding
// arbitrary values (diverged, corrupted, NaN or ±Inf) move no coordinate
// outside the range the honest ranks span, where a plain mean follows a
// single huge value anywhere.
//
// Steps decide who takes part, not how much: a rank that trained no steps
// since its last round (Round.Steps 0: idle, or handed no work) is left out
// of the round, and every rank that trained counts once. Weighing values by
// steps would let one rank's step count, rather than its values, decide
// what counts as an outlier. When fewer ranks trained than 2·Trim+1 the
// trim shrinks so that at least one value is left (the median, or the mean
// of the middle two); one rank alone keeps its values, so a cohort down to
// one rank needs no rounds (AveragerTraits.SoloIdentity).
//
// The ranks meet through the coordinator's relay (plugin.MeetRelay) and
// nothing else: every rank posts its values and computes the same result
// from the same inputs, bit for bit. That suits models of up to a few
// million parameters; the values travel in as many relay exchanges as the
// relay's limits require.
//
// f32 and f64 tensors, parameters and buffers alike, are averaged; integer
// tensors stay local. A layout with bf16 or f16 tensors is refused at
// Configure rather than left unaveraged, which would let the ranks drift
// apart unnoticed.
//
// Like every example it is written against the SDK alone, so its
// constructor and Describe stand alike to the other plugins' and share no
// code with them.
package trimmedmean

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Name is what Describe reports and what a config file selects:
// averager "trimmedmean" { ... }.
const Name = "trimmedmean"

// Version is this averager's own semantic version, reported by Describe
// (the plugin protocol version is cohort's, negotiated by plugin.Serve).
const Version = "0.1.0"

// Settings are the keys of the config file's averager "trimmedmean" block.
type Settings struct {
	// Trim is how many of the highest and how many of the lowest values
	// each coordinate drops before averaging; 0 is the plain mean.
	Trim int `json:"trim"`
}

// DefaultSettings are the settings of an empty block: trim one value from
// each end, enough to survive one bad rank.
func DefaultSettings() Settings { return Settings{Trim: 1} }

// ParseSettings decodes the averager's config block over the defaults. It
// is strict (plugin.DecodeSettings): a misspelt key fails the run instead
// of silently averaging with the default.
func ParseSettings(raw []byte) (Settings, error) {
	s := DefaultSettings()
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return Settings{}, fmt.Errorf("%s settings: %w", Name, err)
	}
	if s.Trim < 0 {
		return Settings{}, fmt.Errorf("%s settings: key \"trim\": must be 0 or more, got %d", Name, s.Trim)
	}
	return s, nil
}

// header is the bytes before the values in every blob this averager posts:
// the rank's steps this round, little-endian u64.
const header = 8

// span is one averaged tensor's place in the layout and in the value
// stream (the raw bytes of the averaged tensors, in layout order).
type span struct {
	entry  int
	dtype  arena.DType
	param  bool
	off    int // in the stream
	count  int
	nbytes int
}

// Averager is the trimmed-mean averager. It implements plugin.Averager.
type Averager struct {
	log hclog.Logger
	// maxChunk bounds the values one blob carries; 0 means as much as the
	// relay's limits allow for the world. Tests set it small to exercise
	// the split.
	maxChunk int

	// roundMu is held by Average for a whole round and by Configure and
	// Shutdown while they replace what a round uses (the fields down to
	// mu), so the arena is never unmapped under a round.
	roundMu   sync.Mutex
	m         *arena.Mapping
	relay     plugin.Relay
	trim      int
	rank      uint32
	spans     []span
	streamLen int
	chunk     int

	// mu guards the session, which NewSession and Abort change while a
	// round may be in flight.
	mu      sync.Mutex
	members []uint32
	gen     uint64
	aborted context.Context
	abort   context.CancelCauseFunc
}

var _ plugin.Averager = (*Averager)(nil)

// New returns an unconfigured averager logging to log (nil: no logging).
func New(log hclog.Logger) *Averager {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Averager{log: log}
}

// Describe names the averager and asks for the relay as its meeting point.
func (a *Averager) Describe(context.Context) (plugin.Description, error) {
	return plugin.Description{Name: Name, Version: Version, Meeting: plugin.MeetRelay,
		Settings: plugin.SchemaOf(Settings{})}, nil
}

// Configure decodes the settings, maps the arena and starts the first
// session: every rank of the world, generation 0.
func (a *Averager) Configure(_ context.Context, cfg plugin.AveragerConfig) (plugin.AveragerTraits, error) {
	s, err := ParseSettings(cfg.Settings)
	if err != nil {
		return plugin.AveragerTraits{}, err
	}
	if cfg.Relay == nil {
		return plugin.AveragerTraits{}, fmt.Errorf("%s: the host offers no relay", Name)
	}
	if cfg.WorldSize == 0 || cfg.Rank >= cfg.WorldSize {
		return plugin.AveragerTraits{}, fmt.Errorf("%s: rank %d of a world of %d", Name, cfg.Rank, cfg.WorldSize)
	}
	spans, streamLen, err := plan(cfg.Arena.Layout)
	if err != nil {
		return plugin.AveragerTraits{}, err
	}
	// Every rank's blob of one exchange arrives at every rank in one
	// control frame: split the values so a world's worth fits both limits.
	chunk := min(plugin.MaxRelayBlob, plugin.MaxRelayExchange/int(cfg.WorldSize)) - header
	if a.maxChunk > 0 {
		chunk = min(chunk, a.maxChunk)
	}
	if chunk <= 0 {
		return plugin.AveragerTraits{}, fmt.Errorf("%s: a world of %d ranks leaves no room in a relay exchange", Name, cfg.WorldSize)
	}
	m, err := arena.Open(cfg.Arena)
	if err != nil {
		return plugin.AveragerTraits{}, fmt.Errorf("%s: %w", Name, err)
	}

	members := make([]uint32, cfg.WorldSize)
	for r := range members {
		members[r] = uint32(r)
	}
	// Abort a round still running on the old configuration, then wait for
	// it before unmapping what it writes into.
	a.mu.Lock()
	a.renewLocked(errors.New("reconfigured"))
	a.mu.Unlock()
	a.roundMu.Lock()
	if a.m != nil {
		if err := a.m.Close(); err != nil {
			a.log.Warn("unmap the previous arena", "error", err)
		}
	}
	a.m, a.relay, a.trim, a.rank = m, cfg.Relay, s.Trim, cfg.Rank
	a.spans, a.streamLen, a.chunk = spans, streamLen, chunk
	a.mu.Lock()
	a.members, a.gen = members, 0
	a.renewLocked(errors.New("reconfigured"))
	a.mu.Unlock()
	a.roundMu.Unlock()

	if 2*s.Trim+1 > int(cfg.WorldSize) {
		a.log.Info("fewer ranks than 2·trim+1: rounds trim less, down to the median", "trim", s.Trim, "world", cfg.WorldSize)
	}
	a.log.Debug("configured", "trim", s.Trim, "tensors", len(spans), "bytes", streamLen,
		"exchanges_per_round", chunks(streamLen, chunk))
	// A round of one rank trims nothing and writes back the values it
	// read, exactly (f32 → f64 → f32 is lossless).
	return plugin.AveragerTraits{SoloIdentity: true}, nil
}

// plan lists the tensors a round averages and the length of their stream.
func plan(l arena.Layout) ([]span, int, error) {
	var spans []span
	off := 0
	for i, e := range l.Entries {
		switch e.DType {
		case arena.F32, arena.F64:
		case arena.BF16, arena.F16:
			return nil, 0, fmt.Errorf("%s: tensor %q is %v; this averager averages f32 and f64 only", Name, e.Name, e.DType)
		default:
			continue // integer tensors (step counters, say) stay local
		}
		n := int(e.Bytes / e.DType.Size())
		spans = append(spans, span{entry: i, dtype: e.DType, param: e.Role == arena.Parameter,
			off: off, count: n, nbytes: int(e.Bytes)})
		off += int(e.Bytes)
	}
	return spans, off, nil
}

// chunks is how many exchanges carry n bytes of values, at least one: the
// first also tells every rank the others' steps.
func chunks(n, chunk int) int { return max(1, (n+chunk-1)/chunk) }

// renewLocked ends the current session's abort context with why and starts
// a fresh one.
func (a *Averager) renewLocked(why error) {
	if a.abort != nil {
		a.abort(why)
	}
	a.aborted, a.abort = context.WithCancelCause(context.Background())
}

// Average runs one round: post this rank's values, gather everyone's, and
// write the trimmed mean (or, for a broadcast, the root's values) into the
// arena.
func (a *Averager) Average(ctx context.Context, r plugin.Round) (plugin.RoundResult, error) {
	start := time.Now()
	a.roundMu.Lock()
	defer a.roundMu.Unlock()
	if a.m == nil {
		return plugin.RoundResult{}, fmt.Errorf("%s: not configured", Name)
	}
	a.mu.Lock()
	members, gen, aborted := a.members, a.gen, a.aborted
	a.mu.Unlock()
	if aborted.Err() != nil {
		return plugin.RoundResult{}, fmt.Errorf("%s: round %d: %w: %v", Name, r.Round, plugin.ErrRoundAborted, context.Cause(aborted))
	}
	if !slices.Contains(members, a.rank) {
		return plugin.RoundResult{}, fmt.Errorf("%s: rank %d is not a member of session %d (%v)", Name, a.rank, gen, members)
	}
	if r.Broadcast && int(r.Root) >= len(members) {
		return plugin.RoundResult{}, fmt.Errorf("%s: broadcast root %d is not a rank of a session of %d", Name, r.Root, len(members))
	}

	mine, err := a.snapshot()
	if err != nil {
		return plugin.RoundResult{}, err
	}
	// Abort and NewSession end the wait through the session's context.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(aborted, cancel)
	defer stop()
	streams, steps, moved, err := a.exchange(rctx, r, gen, members, mine)
	if aborted.Err() != nil {
		return plugin.RoundResult{}, fmt.Errorf("%s: round %d: %w: %v", Name, r.Round, plugin.ErrRoundAborted, context.Cause(aborted))
	}
	if err != nil {
		// A peer's death reaches us as the relay's error, which wraps
		// plugin.ErrRoundAborted: keep it wrapped so the core re-forms
		// the group instead of ending the rank.
		return plugin.RoundResult{}, fmt.Errorf("%s: round %d: %w", Name, r.Round, err)
	}
	reduceStart := time.Now()

	res := plugin.RoundResult{Weight: float64(r.Steps), BytesMoved: moved, WaitMS: plugin.Milliseconds(reduceStart.Sub(start))}
	var trained [][]byte // the values of the ranks that trained, in member order
	for _, m := range members {
		res.TotalWeight += float64(steps[m])
		if streams[m] != nil && steps[m] > 0 {
			trained = append(trained, streams[m])
		}
	}

	var out func(s span, j int) float64
	switch {
	case r.Broadcast:
		src := streams[members[r.Root]]
		if src == nil {
			return plugin.RoundResult{}, fmt.Errorf("%s: round %d: %w: broadcast root %d (rank %d) posted nothing",
				Name, r.Round, plugin.ErrRoundAborted, r.Root, members[r.Root])
		}
		out = func(s span, j int) float64 { return s.value(src, j) }
	case len(trained) > 0:
		col := make([]float64, len(trained))
		out = func(s span, j int) float64 {
			for k, st := range trained {
				col[k] = s.value(st, j)
			}
			return TrimmedMean(col, a.trim)
		}
	default:
		// Nobody trained: every rank keeps its values.
		res.TotalMS = plugin.Milliseconds(time.Since(start))
		return res, nil
	}
	res.Realized = true
	if err := a.write(mine, out, &res); err != nil {
		return plugin.RoundResult{}, err
	}
	end := time.Now()
	res.ReduceMS, res.TotalMS = plugin.Milliseconds(end.Sub(reduceStart)), plugin.Milliseconds(end.Sub(start))
	return res, nil
}

// snapshot copies the averaged tensors' bytes out of the arena: what this
// rank posts, and the "before" of the round's norms.
func (a *Averager) snapshot() ([]byte, error) {
	mine := make([]byte, 0, a.streamLen)
	for _, s := range a.spans {
		t, err := a.m.Tensor(s.entry)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", Name, err)
		}
		mine = append(mine, t...)
	}
	return mine, nil
}

// exchange posts mine, in as many chunks as the relay's limits need, and
// returns each member's whole stream and steps by global rank. A member
// that died before posting has neither.
func (a *Averager) exchange(ctx context.Context, r plugin.Round, gen uint64, members []uint32, mine []byte) (map[uint32][]byte, map[uint32]uint64, uint64, error) {
	streams := make(map[uint32][]byte, len(members))
	steps := make(map[uint32]uint64, len(members))
	var moved uint64
	n := chunks(len(mine), a.chunk)
	for c := range n {
		part := mine[min(c*a.chunk, len(mine)):min((c+1)*a.chunk, len(mine))]
		blob := binary.LittleEndian.AppendUint64(make([]byte, 0, header+len(part)), r.Steps)
		blob = append(blob, part...)
		// The generation and round make every key unique within the run, as
		// the relay requires: round numbers never repeat, and a re-formed
		// group starts a new generation.
		key := fmt.Sprintf("%s/g%d/r%d/c%d", Name, gen, r.Round, c)
		got, err := a.relay.Exchange(ctx, key, blob)
		if err != nil {
			return nil, nil, 0, err
		}
		moved += uint64(len(blob))
		for _, m := range members {
			b, ok := got[m]
			if !ok {
				continue
			}
			if len(b) != len(blob) {
				return nil, nil, 0, fmt.Errorf("rank %d posted %d bytes under %q, want %d: do the ranks run the same model and averager version?", m, len(b), key, len(blob))
			}
			s := binary.LittleEndian.Uint64(b)
			if c > 0 && s != steps[m] {
				return nil, nil, 0, fmt.Errorf("rank %d posted %d steps under %q and %d before", m, s, key, steps[m])
			}
			if c > 0 && streams[m] == nil {
				return nil, nil, 0, fmt.Errorf("rank %d posted under %q but not under the round's first key", m, key)
			}
			steps[m] = s
			streams[m] = append(streams[m], b[header:]...)
			if m != a.rank {
				moved += uint64(len(b))
			}
		}
	}
	return streams, steps, moved, nil
}

// write stores out's value for every averaged coordinate into the arena
// and fills res's norms over the parameter tensors (pre: mine).
func (a *Averager) write(mine []byte, out func(s span, j int) float64, res *plugin.RoundResult) error {
	var preSq, postSq, diffSq float64
	for _, s := range a.spans {
		t, err := a.m.Tensor(s.entry)
		if err != nil {
			return fmt.Errorf("%s: %w", Name, err)
		}
		for j := range s.count {
			v := s.put(t, j, out(s, j))
			if s.param {
				x := s.value(mine, j)
				preSq += x * x
				postSq += v * v
				diffSq += (x - v) * (x - v)
			}
		}
	}
	res.PreNorm, res.PostNorm = math.Sqrt(preSq), math.Sqrt(postSq)
	res.Divergence = math.Sqrt(diffSq)
	if res.PostNorm > 0 {
		res.Divergence /= res.PostNorm
	}
	return nil
}

// value reads coordinate j of s from a stream.
func (s span) value(stream []byte, j int) float64 {
	if s.dtype == arena.F32 {
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(stream[s.off+4*j:])))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(stream[s.off+8*j:]))
}

// put writes v as coordinate j of the tensor bytes t and returns the value
// stored, after rounding to the tensor's type.
func (s span) put(t []byte, j int, v float64) float64 {
	if s.dtype == arena.F32 {
		f := float32(v)
		binary.LittleEndian.PutUint32(t[4*j:], math.Float32bits(f))
		return float64(f)
	}
	binary.LittleEndian.PutUint64(t[8*j:], math.Float64bits(v))
	return v
}

// TrimmedMean sorts col in place and returns the mean of its values
// without the trim lowest and trim highest, trimming less when that would
// leave nothing: at most (len(col)-1)/2 from each end. NaN sorts below
// every number, so it is trimmed as a low value; col must not be empty.
// The result depends only on the multiset of values, never on their order,
// which keeps the ranks bitwise equal.
func TrimmedMean(col []float64, trim int) float64 {
	n := len(col)
	k := min(trim, (n-1)/2)
	slices.Sort(col)
	var sum float64
	for _, v := range col[k : n-k] {
		sum += v
	}
	return sum / float64(n-2*k)
}

// NewSessionID returns a fresh random id for a re-formed group.
func (a *Averager) NewSessionID(context.Context) ([]byte, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("%s: session id: %w", Name, err)
	}
	return id, nil
}

// NewSession re-forms the group: later rounds meet among s.Members under
// s.Generation's keys, a round of the old group still in flight fails as
// aborted, and an Abort is lifted.
func (a *Averager) NewSession(_ context.Context, s plugin.Session) error {
	if len(s.Members) == 0 || int(s.NewRank) >= len(s.Members) {
		return fmt.Errorf("%s: session %d: new rank %d of %d members", Name, s.Generation, s.NewRank, len(s.Members))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.members, a.gen = slices.Clone(s.Members), s.Generation
	a.renewLocked(fmt.Errorf("superseded by session %d", s.Generation))
	return nil
}

// Abort fails the round in flight at once and every later one until the
// next NewSession (or Configure).
func (a *Averager) Abort(_ context.Context, reason string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.abort != nil {
		a.abort(errors.New(reason))
	}
	return nil
}

// SaveState writes nothing: a trimmed mean keeps no state between rounds.
func (a *Averager) SaveState(context.Context, string) ([]string, error) { return nil, nil }

// LoadState has nothing to restore.
func (a *Averager) LoadState(context.Context, string) error { return nil }

// Shutdown fails a round in flight, waits for it to return and unmaps the
// arena.
func (a *Averager) Shutdown(context.Context) error {
	if err := a.Abort(context.Background(), "shut down"); err != nil {
		return err
	}
	a.roundMu.Lock()
	defer a.roundMu.Unlock()
	a.relay = nil
	if a.m == nil {
		return nil
	}
	err := a.m.Close()
	a.m = nil
	return err
}
