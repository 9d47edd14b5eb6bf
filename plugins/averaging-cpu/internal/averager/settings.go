package averager

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/cohortdl/cohort/shared/arena"
	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/reduce"
	"github.com/cohortdl/cohort/shared/reduce/numeric"
)

// Settings is the `averager "cpu"` config block (AveragerConfig.Settings as
// JSON). Unknown keys are errors.
type Settings struct {
	// Gamma weighs a rank's parameters by steps^gamma (default 1).
	Gamma *float64 `json:"gamma"`
	// Wire is the element encoding between hosts: "f32" (default) or
	// "bf16": half the bytes, the parameters sent as their change since
	// the previous round, rounded to nearest even, with what rounding
	// drops carried to the next round (buffers are sent as they are).
	// Ranks of one host never encode: they reduce through shared memory.
	Wire string `json:"wire"`
	// EASGDAlpha, in (0, 1], makes the averager leave
	// local + alpha·(consensus − local) in the arena instead of the
	// consensus (not in broadcast rounds). It is the same blend as the
	// trainer's Adopt blendAlpha: use one or the other, not both (with
	// this set, the core adopts with blendAlpha 0, i.e. overwrite).
	// Default 0: off.
	EASGDAlpha *float64 `json:"easgd_alpha"`
	// Outer is the outer optimizer: "none" (default), "slowmo" or
	// "diloco" (Nesterov momentum on the pseudo-gradient; the trainer's
	// inner optimizer keeps its state across rounds).
	Outer string `json:"outer"`
	// OuterLR (default 1.0 for slowmo, 0.7 for diloco) and OuterMomentum
	// (default 0.9) are its hyper-parameters.
	OuterLR       *float64 `json:"outer_lr"`
	OuterMomentum *float64 `json:"outer_momentum"`
	// Smoothing, in [0, 1), low-pass filters the consensus across rounds:
	// slow momentum with unit gain (v = s·v + g; new = prev − (1−s)·v,
	// g = prev − consensus), so the cohort keeps its pace while one
	// round's noise is spread over the next 1/(1−s). Rounds with one
	// member are left as they are, so a lone rank trains as its trainer
	// alone. Default DefaultSmoothing, or 0 for an arena that carries the
	// optimizer's momentum (see forLayout); 0 turns it off, as does naming
	// an outer optimizer.
	Smoothing *float64 `json:"smoothing"`
	// Host names the shared-memory domain: "" (default) detects it (same
	// kernel and same /dev/shm mount = same host); "rank" makes every rank
	// its own host, so all parameters cross TCP (for tests, or ranks in
	// separate containers); any other value is an explicit name.
	Host string `json:"host"`
	// Threads is how many goroutines this rank reduces its slice with;
	// 0 (default) shares the machine's CPUs among the host's ranks.
	Threads int `json:"threads"`
	// Timeout bounds every read and write of the data channel (the server
	// and the rank ping each other while idle), as a duration string.
	// Default "30s".
	Timeout string `json:"timeout" setting:"duration"`
	// ConnectTimeout bounds reaching the reduce server at Configure.
	// Default "60s".
	ConnectTimeout string `json:"connect_timeout" setting:"duration"`
	// ShmDir is where the host's shared segments live; default the
	// directory of the rank's arena.
	ShmDir string `json:"shm_dir"`
	// RingPort is the first TCP port a rank tries for the links of the
	// host leaders' ring (a cohort across hosts sums host folds leader to
	// leader); ranks of one host take the next free one of the 64 from
	// there. Default 0: any free port. Every rank listens, since any may
	// come to lead its host.
	RingPort int `json:"ring_port"`
}

// DefaultSmoothing is smoothing's default. Averaging every few batches
// lets one round's noise through whole; filtering it over about two rounds
// at unit gain brought cohort's accuracy on the Fashion-MNIST MLP from
// 0.34 points below DDP's after 3 epochs to 0.28 above (`make bench`,
// 5 seeds), at the same pace.
const DefaultSmoothing = 0.5

// config is Settings validated, with defaults filled in.
type config struct {
	gamma          float64
	wire           reduce.Wire
	alpha          float32
	outer          numeric.Outer
	smoothing      bool // outer is the Smoothing filter, which skips lone rounds
	smoothingSet   bool // smoothing or outer was named, not left to the default
	host           string
	threads        int
	timeout        time.Duration
	connectTimeout time.Duration
	shmDir         string
	ringPort       int
}

func parseSettings(raw json.RawMessage) (config, error) {
	var s Settings
	if err := plugin.DecodeSettings(raw, &s); err != nil {
		return config{}, fmt.Errorf("averager settings: %w", err)
	}
	c := config{gamma: 1, wire: reduce.WireF32, host: s.Host, threads: s.Threads, timeout: reduce.DefaultTimeout,
		connectTimeout: 60 * time.Second, shmDir: s.ShmDir, ringPort: s.RingPort}
	bad := func(format string, a ...any) (config, error) {
		return config{}, fmt.Errorf("averager settings: "+format, a...)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if s.Gamma != nil {
		if g := *s.Gamma; !finite(g) || g < 0 || g > 4 {
			return bad("gamma = %v: want a number in [0, 4]", g)
		}
		c.gamma = *s.Gamma
	}
	switch s.Wire {
	case "", "f32":
	case "bf16":
		c.wire = reduce.WireBF16
	default:
		return bad("wire = %q: want \"f32\" or \"bf16\"", s.Wire)
	}
	if s.EASGDAlpha != nil {
		if a := *s.EASGDAlpha; !finite(a) || a < 0 || a > 1 {
			return bad("easgd_alpha = %v: want 0 (off) or a value in (0, 1]", a)
		}
		c.alpha = float32(*s.EASGDAlpha)
	}
	kind, err := numeric.ParseOuter(s.Outer)
	if err != nil {
		return bad("%v", err)
	}
	c.outer.Kind = kind
	switch {
	case kind == numeric.OuterNone && (s.OuterLR != nil || s.OuterMomentum != nil):
		return bad("outer_lr and outer_momentum need outer = \"slowmo\" or \"diloco\"")
	case kind == numeric.OuterSlowMo:
		c.outer.LR, c.outer.Mu = 1.0, 0.9
	case kind == numeric.OuterDiLoCo:
		c.outer.LR, c.outer.Mu = 0.7, 0.9
	}
	if s.OuterLR != nil {
		if v := *s.OuterLR; !finite(v) || v <= 0 || v > 16 {
			return bad("outer_lr = %v: want a value in (0, 16]", v)
		}
		c.outer.LR = float32(*s.OuterLR)
	}
	if s.OuterMomentum != nil {
		if v := *s.OuterMomentum; !finite(v) || v < 0 || v >= 1 {
			return bad("outer_momentum = %v: want a value in [0, 1)", v)
		}
		c.outer.Mu = float32(*s.OuterMomentum)
	}
	smoothing := DefaultSmoothing
	c.smoothingSet = s.Smoothing != nil || s.Outer != ""
	switch {
	case s.Smoothing != nil:
		smoothing = *s.Smoothing
		if !finite(smoothing) || smoothing < 0 || smoothing >= 1 {
			return bad("smoothing = %v: want 0 (off) or a value in (0, 1)", smoothing)
		}
		if s.Outer != "" && smoothing > 0 {
			return bad("smoothing is an outer optimizer of its own: set smoothing or outer = %q, not both", s.Outer)
		}
	case s.Outer != "":
		// An outer optimizer asked for by name, "none" included,
		// replaces the default filter.
		smoothing = 0
	}
	if smoothing > 0 {
		c.outer = numeric.Outer{Kind: numeric.OuterSlowMo, LR: float32(1 - smoothing), Mu: float32(smoothing)}
		c.smoothing = true
	}
	if s.RingPort < 0 || s.RingPort > 65535-63 {
		return bad("ring_port = %d: want 0 (any) to %d", s.RingPort, 65535-63)
	}
	if s.Threads < 0 || s.Threads > 1024 {
		return bad("threads = %d: want 0 (auto) to 1024", s.Threads)
	}
	dur := func(name, v string, def time.Duration) (time.Duration, error) {
		if v == "" {
			return def, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > 24*time.Hour {
			return 0, fmt.Errorf("averager settings: %s = %q: want a duration from 100ms to 24h", name, v)
		}
		return d, nil
	}
	if c.timeout, err = dur("timeout", s.Timeout, c.timeout); err != nil {
		return config{}, err
	}
	if c.connectTimeout, err = dur("connect_timeout", s.ConnectTimeout, c.connectTimeout); err != nil {
		return config{}, err
	}
	return c, nil
}

// momentPrefix starts the names of the optimizer state a trainer puts in
// the arena beside the model (trainer-libtorch's first moments are
// "optimizer.exp_avg.<parameter>").
const momentPrefix = "optimizer."

// forLayout is the configuration for an arena of layout l: the default
// smoothing is off where the arena carries the optimizer's momentum. Its
// rounds leave every rank the cohort's mean momentum, as DDP's optimizer
// has it, and a consensus that is already a step of that momentum; the
// filter would add a second momentum over the first, which slowed the
// transformer of `make bench` (AdamW) from 80.34% to 71.80% after one
// epoch averaging every batch, against DDP's 79.17%.
//
// A bf16 wire sends the parameters as differences from the previous global
// parameters (numeric/delta.go), which the outer optimizer's state holds;
// with none, the averager keeps them itself (numeric.OuterTrack).
func (c config) forLayout(l arena.Layout) config {
	if !c.smoothingSet && c.smoothing {
		for _, e := range l.Entries {
			if e.Role == arena.Buffer && strings.HasPrefix(e.Name, momentPrefix) {
				c.outer, c.smoothing = numeric.Outer{}, false
				break
			}
		}
	}
	if c.wire == reduce.WireBF16 && c.outer.Kind == numeric.OuterNone {
		c.outer = numeric.Outer{Kind: numeric.OuterTrack}
	}
	return c
}

// soloIdentity reports whether a round with one member leaves the arena as
// it is: the weighted mean of one contributor is its own values exactly
// (numeric.Apply copies them), an EASGD blend towards them moves nothing, and
// a lone member is a host of its own, so no wire format touches its values.
// An outer optimizer still steps; smoothing does not (see loneRound), and
// tracking the base of a bf16 wire keeps the values as they are.
func (c config) soloIdentity() bool {
	return c.outer.Kind == numeric.OuterNone || c.outer.Kind == numeric.OuterTrack || c.smoothing
}

// digest fingerprints the settings that must be equal across the cohort.
func (c config) digest() [16]byte {
	s := fmt.Sprintf("gamma=%v wire=%v alpha=%v outer=%v lr=%v mu=%v smooth=%v", c.gamma, c.wire, c.alpha, c.outer.Kind, c.outer.LR, c.outer.Mu, c.smoothing)
	h := sha256.Sum256([]byte(s))
	var d [16]byte
	copy(d[:], h[:])
	return d
}
