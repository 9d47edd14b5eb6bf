package dispatch

import (
	"math"

	"github.com/cohortdl/cohort/core/status"

	"github.com/cohortdl/cohort/core/config"
)

// Controller tuning. The divergence a round reports is each rank's relative
// distance from the average (‖local − average‖ / ‖average‖), meaned over
// the ranks that trained: it grows with the interval, so halving the
// interval about halves it, and the band [relaxBelow, tightenAbove] × the
// target is wide enough that one move does not provoke the opposite one.
const (
	divEMA           = 0.3 // weight of a new round's divergence in the running mean
	tightenAbove     = 1.5 // × target: the interval halves
	relaxBelow       = 0.5 // × target: after calmRounds such rounds the interval grows
	relaxGrowth      = 1.5 // the interval's growth on a relax
	calmRounds       = 5
	cooldownRounds   = 3   // rounds between two moves of the interval
	guardWarmup      = 5   // rounds observed before a spike can be told from the start-up
	guardSettle      = 1.5 // × running mean: a round this close counts towards releasing the guard
	guardSettleCount = 5
	plateauMinGain   = 1e-3 // relative eval-loss improvement that resets the plateau count
	maxDecisions     = 1000 // decisions kept for the summary; later ones are only counted
)

// The divergence targets where the config sets none (divergence_target =
// 0). An adaptive optimizer's ranks (TrainerSetup.AdaptiveOptimizer) read a
// smaller divergence for the same harm: on the transformer of `make bench`
// (AdamW) the default target never moved the interval (0.022 against
// 0.05), and aiming at 0.01 (about 3 batches a round) raised its final
// accuracy on every one of seeds 1-5, by 0.72 points on the mean, to DDP's.
// SGD's models keep 0.05, which that tighter target would drive to a
// round every batch (averaging-cpu's README).
const (
	DivergenceTarget         = 0.05
	AdaptiveDivergenceTarget = 0.01
)

// Decision rules in a ControllerDecision.
const (
	RuleTighten      = "tighten"       // ranks drifted past the target: the interval halved
	RuleRelax        = "relax"         // ranks stayed well inside the target: the interval grew
	RuleGuard        = "guard"         // a divergence spike: interval to its minimum, rate scaled down
	RuleGuardRelease = "guard_release" // divergence settled: the rate is restored
	RulePlateau      = "plateau"       // eval loss stopped improving: the rate scaled down
	RuleOverhead     = "overhead"      // cadence: rounds cost too much of the window: it grew
)

// verdict is the controller's word on the cadence policy's window: the
// window may grow for overhead only while ranks stay within the
// divergence target, and shrinks when they drift well past it.
type verdict int

const (
	verdictGrow   verdict = iota // growth for overhead allowed
	verdictHold                  // divergence above target: no growth
	verdictShrink                // drifting well past it, or the guard holds: halve
)

func (c *controller) verdict() verdict {
	st := &c.st
	switch {
	case !c.adaptive || st.Rounds == 0:
		// No divergence reported (or adaptation off): the overhead rule
		// alone sizes the window.
		return verdictGrow
	case st.Guard || st.DivergenceEMA > tightenAbove*c.target:
		return verdictShrink
	case st.DivergenceEMA > c.target:
		return verdictHold
	}
	return verdictGrow
}

// ControllerState is the controller's state, kept in checkpoints so a
// resumed run decides as the original would have.
type ControllerState struct {
	Interval uint64 `json:"interval"`
	// PlateauScale is the learning-rate multiplier the plateau rule has
	// reached; the guard's factor comes on top while it holds.
	PlateauScale  float64  `json:"plateau_scale"`
	Guard         bool     `json:"guard"`
	DivergenceEMA float64  `json:"divergence_ema"`
	Rounds        uint64   `json:"rounds"`
	Calm          int      `json:"calm"`
	SinceMove     int      `json:"since_move"`
	Settled       int      `json:"settled"`
	BestEvalLoss  *float64 `json:"best_eval_loss,omitempty"`
	BadEpochs     int      `json:"bad_epochs"`
}

// ControllerWindow is what the controller hands a window: its interval in
// batches (sync) and its learning-rate scale.
type ControllerWindow struct {
	Interval uint64  `json:"interval"`
	LRScale  float64 `json:"lr_scale"`
}

// ControllerDecision is one change the controller made, for the summary
// and the log.
type ControllerDecision struct {
	Round      uint64  `json:"round"`
	Epoch      uint64  `json:"epoch"` // from 1
	Rule       string  `json:"rule"`
	Divergence float64 `json:"divergence,omitempty"`
	EvalLoss   float64 `json:"eval_loss,omitempty"`
	From       uint64  `json:"interval_from"`
	To         uint64  `json:"interval_to"`
	LRFrom     float64 `json:"lr_scale_from"`
	LRTo       float64 `json:"lr_scale_to"`
}

// ControllerSummary is the controller's account of a run.
type ControllerSummary struct {
	Adaptive  bool    `json:"adaptive"`
	Interval  uint64  `json:"interval"`
	LRScale   float64 `json:"lr_scale"`
	Throttles uint64  `json:"throttles"`
	// DivergenceTarget is the target the interval aimed at: the config's,
	// or the default for the trainer's optimizer.
	DivergenceTarget float64 `json:"divergence_target"`
	// DivergenceEMA is the running mean of the rounds' divergence at the
	// end of the run.
	DivergenceEMA    float64              `json:"divergence_ema"`
	Decisions        []ControllerDecision `json:"decisions"`
	DecisionsDropped uint64               `json:"decisions_dropped,omitempty"`
}

// controller moves the sync interval with the divergence the ranks report
// (adaptive sync), guards against divergence spikes, and lowers the
// learning rate on a plateau or a spike. Its changes reach the ranks with
// their next plans: every rank's plans after one round carry the same
// interval and scale, so the cohort changes together at one step.
type controller struct {
	adaptive bool
	// moves: the controller sizes the interval itself (sync, async); under
	// cadence the cadence sizes the window and takes the verdict.
	moves           bool
	min, max        uint64
	target          float64
	autoTarget      bool // target is the default for the optimizer (form)
	guardFactor     float64
	guardLR         float64
	plateauPatience int
	plateauFactor   float64
	st              ControllerState
	decisions       []ControllerDecision
	dropped         uint64
	throttles       uint64
	pending         *ControllerWindow // a resumed run's first window
	log             func(d ControllerDecision)
}

func newController(co config.Coordinator, log func(ControllerDecision)) *controller {
	c := &controller{
		adaptive:        co.AdaptiveSync,
		moves:           co.Policy != config.PolicyCadence,
		min:             uint64(max(co.SyncEveryMin, 1)),
		max:             uint64(co.SyncEveryMax),
		target:          co.DivergenceTarget,
		guardFactor:     co.GuardFactor,
		guardLR:         co.GuardLRFactor,
		plateauPatience: co.LRPlateauPatience,
		plateauFactor:   co.LRPlateauFactor,
		st:              ControllerState{Interval: uint64(max(co.SyncEvery, 1)), PlateauScale: 1},
		log:             log,
	}
	// By default the interval only tightens (and relaxes back to
	// sync_every): the divergence it watches is relative to the
	// parameters' norm, which is not the same yardstick on every model,
	// and a looser interval let adaptive optimizers' ranks drift apart
	// (averaging-cpu's README, on optimizer state).
	if c.max == 0 {
		c.max = c.st.Interval
	}
	c.min = min(c.min, c.st.Interval)
	c.max = max(c.max, c.st.Interval)
	if c.guardLR == 0 {
		c.guardLR = 1
	}
	if c.target == 0 {
		c.target, c.autoTarget = DivergenceTarget, true
	}
	return c
}

// form learns at formation whether the ranks' optimizer is adaptive, which
// sets the target where the config left it to the default.
func (c *controller) form(adaptive bool) {
	if !c.autoTarget {
		return
	}
	c.target = DivergenceTarget
	if adaptive {
		c.target = AdaptiveDivergenceTarget
	}
}

// lrScale is the learning-rate multiplier in force.
func (c *controller) lrScale() float64 {
	s := c.st.PlateauScale
	if c.st.Guard {
		s *= c.guardLR
	}
	return s
}

// window is what the next window gets: a resumed run's first window gets
// what the original run's got.
func (c *controller) window() ControllerWindow {
	if c.pending != nil {
		return *c.pending
	}
	return ControllerWindow{Interval: c.st.Interval, LRScale: c.lrScale()}
}

// handed marks the next window handed out: a resumed run's first window is
// behind it.
func (c *controller) handed() { c.pending = nil }

// observeRound folds one completed averaging round's divergences (one per
// rank that trained) into the controller and applies its rules.
func (c *controller) observeRound(round, epoch uint64, divs []float64) {
	var sum float64
	var n int
	for _, d := range divs {
		if finite(d) && d >= 0 {
			sum += d
			n++
		}
	}
	if n == 0 {
		return
	}
	d := sum / float64(n)
	st := &c.st
	st.Rounds++
	st.SinceMove++
	if st.Rounds == 1 {
		st.DivergenceEMA = d
		return
	}
	ema := st.DivergenceEMA
	switch {
	case c.guardFactor > 0 && !st.Guard && st.Rounds > guardWarmup && ema > 0 && d > c.guardFactor*ema:
		// A spike is not folded into the mean: release is judged against
		// the divergence before it.
		from, lrFrom := st.Interval, c.lrScale()
		st.Guard, st.Settled, st.Calm, st.SinceMove = true, 0, 0, 0
		if c.moves {
			st.Interval = c.min
		}
		c.decide(ControllerDecision{Round: round, Epoch: epoch, Rule: RuleGuard, Divergence: d,
			From: from, To: st.Interval, LRFrom: lrFrom, LRTo: c.lrScale()})
		return
	case st.Guard:
		st.DivergenceEMA += divEMA * (d - ema)
		if d <= guardSettle*ema {
			st.Settled++
		} else {
			st.Settled = 0
		}
		if st.Settled >= guardSettleCount {
			lrFrom := c.lrScale()
			st.Guard, st.Settled, st.SinceMove = false, 0, 0
			c.decide(ControllerDecision{Round: round, Epoch: epoch, Rule: RuleGuardRelease, Divergence: d,
				From: st.Interval, To: st.Interval, LRFrom: lrFrom, LRTo: c.lrScale()})
		}
		return
	}
	st.DivergenceEMA += divEMA * (d - ema)
	if !c.adaptive || !c.moves {
		return
	}
	switch ema = st.DivergenceEMA; {
	case ema > tightenAbove*c.target:
		st.Calm = 0
		if st.SinceMove >= cooldownRounds && st.Interval > c.min {
			c.move(round, epoch, RuleTighten, d, max(c.min, st.Interval/2))
		}
	case ema < relaxBelow*c.target:
		st.Calm++
		if st.Calm >= calmRounds && st.SinceMove >= cooldownRounds && st.Interval < c.max {
			grown := uint64(math.Ceil(float64(st.Interval) * relaxGrowth))
			c.move(round, epoch, RuleRelax, d, min(c.max, max(grown, st.Interval+1)))
		}
	default:
		st.Calm = 0
	}
}

func (c *controller) move(round, epoch uint64, rule string, d float64, to uint64) {
	st := &c.st
	lr := c.lrScale()
	c.decide(ControllerDecision{Round: round, Epoch: epoch, Rule: rule, Divergence: d,
		From: st.Interval, To: to, LRFrom: lr, LRTo: lr})
	st.Interval, st.Calm, st.SinceMove = to, 0, 0
}

// observeEval applies the plateau rule to an epoch's eval loss.
func (c *controller) observeEval(round, epoch uint64, loss float64) {
	if !finite(loss) {
		return
	}
	st := &c.st
	if st.BestEvalLoss == nil || loss < *st.BestEvalLoss*(1-plateauMinGain) {
		st.BestEvalLoss, st.BadEpochs = &loss, 0
		return
	}
	st.BadEpochs++
	if c.plateauPatience == 0 || st.BadEpochs < c.plateauPatience {
		return
	}
	lrFrom := c.lrScale()
	st.PlateauScale *= c.plateauFactor
	st.BadEpochs = 0
	c.decide(ControllerDecision{Round: round, Epoch: epoch, Rule: RulePlateau, EvalLoss: loss,
		From: st.Interval, To: st.Interval, LRFrom: lrFrom, LRTo: c.lrScale()})
}

func (c *controller) decide(d ControllerDecision) {
	if len(c.decisions) < maxDecisions {
		c.decisions = append(c.decisions, d)
	} else {
		c.dropped++
	}
	if c.log != nil {
		c.log(d)
	}
}

func (c *controller) state() ControllerState {
	s := c.st
	if s.BestEvalLoss != nil {
		v := *s.BestEvalLoss
		s.BestEvalLoss = &v
	}
	return s
}

// restore continues from a checkpoint: its state, and the window the
// original run handed out after the save point. Values out of the
// configured bounds (a config changed between the runs) are clamped.
func (c *controller) restore(s *ControllerState, w *ControllerWindow) {
	if s != nil {
		c.st = *s
		c.st.Interval = min(max(c.st.Interval, c.min), c.max)
		if !(c.st.PlateauScale > 0) || !finite(c.st.PlateauScale) {
			c.st.PlateauScale = 1
		}
	}
	if w != nil && w.Interval > 0 && w.LRScale > 0 && finite(w.LRScale) {
		pw := *w
		c.pending = &pw
	}
}

// live is the controller for the status page: what is in force and the
// last status.MaxDecisions decisions.
func (c *controller) live() status.Controller {
	s := status.Controller{Adaptive: c.adaptive, Interval: c.st.Interval, LRScale: c.lrScale(), Guard: c.st.Guard,
		DivergenceEMA: safe(c.st.DivergenceEMA), Throttles: c.throttles, Decisions: []status.Decision{}}
	for _, d := range c.decisions[max(0, len(c.decisions)-status.MaxDecisions):] {
		s.Decisions = append(s.Decisions, status.Decision{Round: d.Round, Epoch: d.Epoch, Rule: d.Rule, Divergence: safe(d.Divergence),
			From: d.From, To: d.To, LRFrom: d.LRFrom, LRTo: d.LRTo})
	}
	return s
}

func (c *controller) summary() *ControllerSummary {
	return &ControllerSummary{
		Adaptive:         c.adaptive,
		Interval:         c.st.Interval,
		LRScale:          c.lrScale(),
		Throttles:        c.throttles,
		DivergenceTarget: c.target,
		DivergenceEMA:    c.st.DivergenceEMA,
		Decisions:        append([]ControllerDecision{}, c.decisions...),
		DecisionsDropped: c.dropped,
	}
}

// safe keeps a figure JSON can encode.
func safe(x float64) float64 {
	if !finite(x) {
		return 0
	}
	return x
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
