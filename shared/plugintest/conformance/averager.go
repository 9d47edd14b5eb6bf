package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
)

// RunAverager checks every promise of plugin.Averager on the averagers f
// makes, each promise a subtest of t. Cohorts of World ranks (default 3)
// meet through an in-process relay (plugintest.RelayGroup), and at the
// meeting point MeetingPoint gives for an averager that meets elsewhere.
func RunAverager(t *testing.T, f AveragerFactory, opts ...AveragerOption) {
	t.Helper()
	CheckAverager(Testing(t), f, opts...)
}

// CheckAverager is RunAverager on any T.
func CheckAverager(t T, f AveragerFactory, opts ...AveragerOption) {
	t.Helper()
	o := averagerOptions{world: 3}
	for _, opt := range opts {
		opt(&o)
	}
	s := &avgSuite{f: f, o: o}
	if !t.Run("Describe", s.describe) {
		return // every other check meets as Describe says
	}
	t.Run("WeightedMean/gamma=1", func(t T) { s.weightedMean(t, 1, o.settings) })
	for _, g := range o.gammas {
		t.Run(fmt.Sprintf("WeightedMean/gamma=%v", g.gamma), func(t T) { s.weightedMean(t, g.gamma, g.settings) })
	}
	t.Run("IdleRanksWeighNothing", s.idleRanks)
	t.Run("AllIdle", s.allIdle)
	t.Run("Broadcast", s.broadcast)
	t.Run("Abort", s.abort)
	t.Run("NewSessionAfterDeath", s.death)
	t.Run("ShutdownInFlight", s.shutdownInFlight)
	for _, v := range s.variants() {
		t.Run("SaveLoadState/"+v.name, func(t T) { s.saveLoad(t, v.settings) })
	}
	for _, v := range s.variants() {
		t.Run("SoloIdentity/"+v.name, func(t T) { s.solo(t, v.settings) })
	}
}

type avgSuite struct {
	f AveragerFactory
	o averagerOptions
}

type variant struct {
	name     string
	settings json.RawMessage
}

// variants are the settings the state and solo checks run under.
func (s *avgSuite) variants() []variant {
	vs := []variant{{"settings", s.o.settings}}
	for _, g := range s.o.gammas {
		vs = append(vs, variant{fmt.Sprintf("gamma=%v", g.gamma), g.settings})
	}
	if s.o.stateful != nil {
		vs = append(vs, variant{"stateful", s.o.stateful})
	}
	return vs
}

func callCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func (s *avgSuite) describe(t T) {
	a, err := s.f(t)
	if err != nil {
		t.Fatalf("the factory could not make an averager: %v", err)
	}
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	d, err := a.Describe(ctx)
	if err != nil {
		t.Fatalf("Describe must succeed before Configure: %v", err)
	}
	if d.Name == "" || d.Version == "" {
		t.Errorf("Describe must return a non-empty Name and Version: got name %q, version %q", d.Name, d.Version)
	}
	switch d.MeetingKind() {
	case plugin.MeetRelay, plugin.MeetReduceServer:
	default:
		t.Fatalf("Describe.Meeting must be empty, %q or %q: got %q", plugin.MeetRelay, plugin.MeetReduceServer, d.Meeting)
	}
}

// weights are steps^gamma, 0 for no steps.
func weights(steps []uint64, gamma float64) []float64 {
	w := make([]float64, len(steps))
	for i, n := range steps {
		if n > 0 {
			w[i] = math.Pow(float64(n), gamma)
		}
	}
	return w
}

const meanPromise = "a round must leave the weighted mean Σ wᵢxᵢ / Σ wᵢ with wᵢ = stepsᵢ^gamma in parameters, and the plain mean of the ranks that trained in f32 buffers"

func (s *avgSuite) weightedMean(t T, gamma float64, settings json.RawMessage) {
	c := s.newCohort(t, s.o.world, settings)
	idx := all(c)
	steps := make([]uint64, len(idx))
	for i := range steps {
		steps[i] = uint64(i + 1)
	}
	pre := c.snapshot()
	res := c.average(idx, 1, steps)
	if !s.o.notMean {
		c.checkMean(fmt.Sprintf("%s (gamma %v, steps %v)", meanPromise, gamma, steps), idx, idx, pre, weights(steps, gamma))
	}
	c.checkIdentical(idx)
	c.checkUnchanged("entries that are not f32 must stay local", idx, pre, false)
	for r, x := range res {
		if !x.Realized {
			t.Errorf("RoundResult.Realized must be true when a rank trained: rank %d said false", r)
		}
	}
}

func (s *avgSuite) idleRanks(t T) {
	c := s.newCohort(t, s.o.world, s.o.settings)
	idx := all(c)
	steps := make([]uint64, len(idx))
	for i := 1; i < len(steps); i++ {
		steps[i] = uint64(i + 1)
	}
	const promise = "a rank with steps 0 must weigh nothing"
	pre := c.snapshot()
	c.average(idx, 1, steps)
	if !s.o.notMean && !c.checkMean(fmt.Sprintf("%s (steps %v)", promise, steps), idx, idx, pre, weights(steps, 1)) {
		return
	}
	first := c.snapshot()
	// The same round again, the idle rank holding other values: nobody's
	// result may change.
	c.restore(pre)
	c.fillRank(0, 99)
	c.average(idx, 2, steps)
	for _, r := range idx {
		for i, e := range c.layout.Entries {
			b, _ := c.ranks[r].arena.Tensor(i)
			if k := diffAt(first[r][i], b); k >= 0 && e.DType.IsFloat() {
				t.Errorf("%s: the same round with idle rank 0 holding other values changed rank %d's %q[%d] from %v to %v (steps %v)",
					promise, r, e.Name, k, f32(first[r][i], k), f32(b, k), steps)
				return
			}
		}
	}
}

func (s *avgSuite) allIdle(t T) {
	c := s.newCohort(t, s.o.world, s.o.settings)
	idx := all(c)
	pre := c.snapshot()
	res := c.average(idx, 1, make([]uint64, len(idx)))
	c.checkUnchanged("when every rank's steps are 0 a round must leave every arena as it is", idx, pre, true)
	for r, x := range res {
		if x.Realized {
			t.Errorf("when every rank's steps are 0 RoundResult.Realized must be false: rank %d said true", r)
		}
	}
}

// checkCopied: the listed ranks' f32 entries are bit for bit what rank
// root held in pre.
func (c *cohort) checkCopied(promise string, idx []int, root int, pre snapshot) {
	c.t.Helper()
	for _, r := range idx {
		for i, e := range c.layout.Entries {
			b, _ := c.ranks[r].arena.Tensor(i)
			if k := diffAt(pre[root][i], b); k >= 0 && e.DType.IsFloat() {
				c.t.Errorf("%s: rank %d's %q[%d] is %v, the root (global rank %d) held %v",
					promise, r, e.Name, k, f32(b, k), root, f32(pre[root][i], k))
				return
			}
		}
	}
}

func (s *avgSuite) broadcast(t T) {
	c := s.newCohort(t, s.o.world, s.o.settings)
	idx := all(c)
	const root = 1
	rounds := make([]plugin.Round, len(idx))
	for i := range rounds {
		rounds[i] = plugin.Round{Round: 1, Steps: uint64(i % 2), Broadcast: true, Root: root}
	}
	pre := c.snapshot()
	res, errs := c.rounds(idx, rounds)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("a broadcast round from rank %d must succeed: rank %d: %v", root, r, err)
		}
	}
	c.checkCopied("a broadcast round must copy the root's values to every rank, bit for bit", idx, root, pre)
	c.checkUnchanged("entries that are not f32 must stay local", idx, pre, false)
	for r, x := range res {
		if !x.Realized {
			t.Errorf("a broadcast round's RoundResult.Realized must be true: rank %d said false", r)
		}
	}
}

// newSession starts session gen with members on each of them.
func (c *cohort) newSession(gen uint64, members []int) {
	c.t.Helper()
	ctx, cancel := callCtx(CallBound)
	defer cancel()
	id, err := c.ranks[members[0]].avg.NewSessionID(ctx)
	if err != nil {
		c.t.Fatalf("NewSessionID must succeed: %v", err)
	}
	global := make([]uint32, len(members))
	for i, r := range members {
		global[i] = uint32(r)
	}
	errs := make([]error, len(c.ranks))
	c.each(members, func(ctx context.Context, r int) {
		var nr uint32
		for i, m := range members {
			if m == r {
				nr = uint32(i)
			}
		}
		errs[r] = c.ranks[r].avg.NewSession(ctx, plugin.Session{Generation: gen, ID: id, NewRank: nr, NewWorldSize: uint32(len(members)), Members: global})
	})
	for r, err := range errs {
		if err != nil {
			c.t.Fatalf("NewSession (generation %d, members %v) must succeed: rank %d: %v", gen, members, r, err)
		}
	}
}

func countUp(n int) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = uint64(i + 1)
	}
	return s
}

func (s *avgSuite) abort(t T) {
	c := s.newCohort(t, s.o.world, s.o.settings)
	idx := all(c)
	last := len(idx) - 1
	f := c.launch(idx[:last], 1) // the last rank never comes
	start := time.Now()
	for _, r := range idx[:last] {
		ctx, cancel := callCtx(PromptBound)
		err := c.ranks[r].avg.Abort(ctx, "conformance suite: abort")
		cancel()
		if err != nil {
			t.Errorf("Abort must succeed: rank %d: %v", r, err)
		}
	}
	deadline := start.Add(PromptBound)
	for i, r := range idx[:last] {
		switch {
		case !f.returned(i, deadline):
			t.Errorf("Abort must make the in-flight round return within %v: rank %d's round had not returned after %v", PromptBound, r, time.Since(start).Round(time.Millisecond))
		case !errors.Is(f.errs[i], plugin.ErrRoundAborted):
			t.Errorf("the round Abort ended must fail with an error wrapping plugin.ErrRoundAborted: rank %d returned %v", r, f.errs[i])
		}
	}
	f.join()
	g := c.launch(idx[:1], 2)
	switch {
	case !g.returned(0, time.Now().Add(PromptBound)):
		t.Errorf("an aborted averager must refuse rounds until NewSession: rank 0's next round waited for its peers instead (%v)", PromptBound)
	case g.errs[0] == nil:
		t.Errorf("an aborted averager must refuse rounds until NewSession: rank 0's next round succeeded")
	}
	g.join()
	c.newSession(1, idx)
	c.fill(2)
	pre := c.snapshot()
	steps := countUp(len(idx))
	c.average(idx, 3, steps)
	if !s.o.notMean {
		c.checkMean("after NewSession an aborted averager's rounds must work again: "+meanPromise, idx, idx, pre, weights(steps, 1))
	}
	c.checkIdentical(idx)
}

// kill takes rank r out as the coordinator does when it dies: the relay
// and the meeting point forget it, and its averager is shut down.
func (c *cohort) kill(r int) {
	c.relay.Kill(uint32(r))
	if c.meet.MarkDead != nil {
		c.meet.MarkDead(uint32(r))
	}
	c.each([]int{r}, func(ctx context.Context, r int) { c.ranks[r].avg.Shutdown(ctx) })
	c.ranks[r].down = true
}

func (s *avgSuite) death(t T) {
	c := s.newCohort(t, s.o.world, s.o.settings)
	survivors := all(c)[1:] // rank 0 dies, so session and global ranks differ
	f := c.launch(survivors, 1)
	c.kill(0)
	deadline := time.Now().Add(PromptBound)
	for i, r := range survivors {
		if !f.returned(i, deadline) {
			// The core's watchdog aborts a round stuck on a dead peer.
			ctx, cancel := callCtx(PromptBound)
			c.ranks[r].avg.Abort(ctx, "conformance suite: a peer died")
			cancel()
			if !f.returned(i, time.Now().Add(PromptBound)) {
				t.Errorf("a round in flight when a peer dies must end, at the latest on Abort (within %v): rank %d's had not", PromptBound, r)
				continue
			}
		}
		if err := f.errs[i]; err != nil && !errors.Is(err, plugin.ErrRoundAborted) {
			t.Errorf("a round in flight when a peer dies must complete among the survivors or fail wrapping plugin.ErrRoundAborted: rank %d returned %v", r, err)
		}
	}
	f.join()
	const promise = "after a rank dies, NewSession among the survivors must make rounds work again"
	c.newSession(1, survivors)
	c.fill(3)
	pre := c.snapshot()
	steps := countUp(len(survivors))
	c.average(survivors, 2, steps)
	if !s.o.notMean {
		c.checkMean(promise+": "+meanPromise, survivors, survivors, pre, weights(steps, 1))
	}
	c.checkIdentical(survivors)

	// Round.Root is an index into the session's members.
	c.fill(4)
	pre = c.snapshot()
	rounds := make([]plugin.Round, len(survivors))
	for i := range rounds {
		rounds[i] = plugin.Round{Round: 3, Steps: 1, Broadcast: true, Root: 0}
	}
	_, errs := c.rounds(survivors, rounds)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: a broadcast from session rank 0 (global rank %d): rank %d: %v", promise, survivors[0], survivors[i], err)
		}
	}
	c.checkCopied("a broadcast's Round.Root is the root's rank in the session (Session.NewRank), not its global rank", survivors, survivors[0], pre)
}

func (s *avgSuite) shutdownInFlight(t T) {
	c := s.newCohort(t, s.o.world, s.o.settings)
	idx := all(c)
	f := c.launch(idx[:len(idx)-1], 1) // the last rank never comes
	start := time.Now()
	ctx, cancel := callCtx(PromptBound + grace)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.ranks[0].avg.Shutdown(ctx) }()
	var shutErr error
	select {
	case shutErr = <-done:
	case <-time.After(PromptBound):
		t.Errorf("Shutdown must return within %v even with a round in flight: rank 0's had not", PromptBound)
		// What a Shutdown stuck on its own round needs to end.
		f.join()
		select {
		case shutErr = <-done:
		case <-time.After(grace):
			t.Fatalf("Shutdown returned neither after Abort nor %v after its context ended; it is left running", grace)
		}
	}
	c.ranks[0].down = true
	if shutErr != nil {
		t.Errorf("Shutdown with a round in flight must succeed: %v", shutErr)
	}
	if !f.returned(0, start.Add(PromptBound)) {
		t.Errorf("the round in flight must return when Shutdown is called (within %v): rank 0's had not", PromptBound)
	}
}
