package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/wire"
)

const runUsage = `usage: cohort run [--config FILE] [--ranks N] [--epochs E] [--trainer NAME] [--averaging NAME]
                  [--out DIR] [--resume DIR] [-v|-vv|-vvv]

Trains on this machine: a coordinator in this process and N rank workers
(` + "`cohort worker`" + ` subprocesses). Ctrl-C saves a checkpoint and stops; a second
Ctrl-C kills the workers. Exit status 0 means the run completed.

`

// Exit statuses of run and coordinator.
const (
	exitCompleted = 0
	exitFailed    = 1
	exitUsage     = 2
	exitStopped   = 130 // the shell's code for "ended by SIGINT"
)

// EffectiveConfigFile is the config a run's workers read, written into the
// out directory: the file plus the command line's overrides.
const effectiveConfigFile = "config.hcl"

// How long workers get to exit after the coordinator is done before they
// are killed.
const childExitGrace = 15 * time.Second

// runCommand is `cohort run`.
func runCommand(args []string) int {
	// The coordinator of a run on one host only relays: plans, reports,
	// rounds' bookkeeping (its reduce server folds nothing when every rank
	// shares the host). With one P its goroutines hand work to each other
	// on one thread instead of waking idle threads on the cores the ranks
	// train on: measured on a 2-core machine by stopping and resuming a
	// lone-rank run's coordinator every other epoch of a 2-thread libtorch
	// loop, it cost that loop about 3% with the default P count and about
	// 0-1% with one. $GOMAXPROCS overrides.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
	verbosity, args := countVerbosity(args)
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), runUsage)
		fs.PrintDefaults()
	}
	cfgPath := fs.String("config", "", "HCL config file (default: the built-in configuration)")
	ranks := fs.Int("ranks", 0, "rank workers (default: the config's run.ranks)")
	epochs := fs.Int("epochs", 0, "epochs (default: the config's run.epochs)")
	// Only flags given on the command line override the file.
	trainer := fs.String("trainer", "", "trainer plugin name (default: the config's)")
	averaging := fs.String("averaging", "", "averaging plugin name (default: the config's)")
	out := fs.String("out", "", "output directory (default: runs/<timestamp>)")
	resume := fs.String("resume", "", "continue from a checkpoint, a run's out directory or its checkpoints directory")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitCompleted
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cohort run: unexpected argument %q\n\n", fs.Arg(0))
		fs.Usage()
		return exitUsage
	}

	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitFailed
	}
	var o config.Overrides
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "ranks":
			o.Ranks = ranks
		case "epochs":
			o.Epochs = epochs
		}
	})
	o.Trainer, o.Averager = *trainer, *averaging
	switch {
	case *out != "":
		o.Out = out
	case cfg.Run.Out == config.Default().Run.Out:
		// The built-in default would make every run share one directory.
		stamp := "runs/" + time.Now().Format("20060102-150405")
		o.Out = &stamp
	}
	if err := cfg.Apply(o); err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitUsage
	}

	l := &launcher{cfg: cfg, resume: *resume, verbosity: verbosity}
	return l.run()
}

var verbosityFlag = regexp.MustCompile(`^--?(v+)$`)

// countVerbosity takes -v, -vv, -vvv (or repeated -v) out of args and
// counts them, since the flag package has no counted flags.
func countVerbosity(args []string) (int, []string) {
	n := 0
	var rest []string
	for i, a := range args {
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		if m := verbosityFlag.FindStringSubmatch(a); m != nil {
			n += len(m[1])
			continue
		}
		rest = append(rest, a)
	}
	return min(n, 3), rest
}

func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return config.Default(), nil
	}
	return config.Load(path)
}

// logLevel maps -v counts to the coordinator's log level; by default it
// logs warnings only, progress lines say the rest.
func logLevel(verbosity int) hclog.Level {
	return [...]hclog.Level{hclog.Warn, hclog.Info, hclog.Debug, hclog.Trace}[min(verbosity, 3)]
}

// launcher is one `cohort run`: the coordinator in process, the workers
// as children.
type launcher struct {
	cfg       *config.Config
	resume    string
	verbosity int

	stderr *lockedWriter
	log    hclog.Logger
}

func (l *launcher) run() int {
	l.stderr = &lockedWriter{w: os.Stderr}
	l.log = hclog.New(&hclog.LoggerOptions{Name: "cohort", Level: logLevel(l.verbosity), Output: l.stderr})

	secret, err := newSecret()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitFailed
	}
	keys, err := wire.DeriveKeys(secret)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitFailed
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: find this executable for the workers: %v\n", err)
		return exitFailed
	}
	// The embedded coordinator serves this machine only, on any free port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: listen: %v\n", err)
		return exitFailed
	}

	prog := newProgressPrinter(os.Stdout, isTerminal(os.Stdout))
	defer prog.close()
	formed := make(chan struct{})
	var formedOnce sync.Once
	coord, err := coordinator.New(coordinator.Options{
		Config:   l.cfg,
		Keys:     keys,
		Listener: ln,
		Resume:   l.resume,
		Logger:   l.log,
		Progress: func(p coordinator.Progress) {
			if p.Kind == coordinator.ProgressFormed {
				formedOnce.Do(func() { close(formed) })
			}
			prog.report(p)
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitFailed
	}
	cfgFile := filepath.Join(coord.Out(), effectiveConfigFile)
	if err := writeConfigHCL(cfgFile, l.cfg); err != nil {
		coord.Close()
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitFailed
	}
	prog.line(fmt.Sprintf("run %s: %d ranks, %d epochs, policy %s, trainer %s, averager %s; out %s",
		coord.RunID(), l.cfg.Run.Ranks, l.cfg.Run.Epochs, l.cfg.Coordinator.Policy, l.cfg.Trainer.Name, l.cfg.Averager.Name, coord.Out()))

	// From here on Ctrl-C belongs to the run: the first stops it cleanly.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	kids := newChildren(l.cfg.Run.Ranks)
	// Whatever happens below, no worker outlives the launcher.
	defer kids.killAll()

	type runResult struct {
		sum *coordinator.Summary
		err error
	}
	done := make(chan runResult, 1)
	go func() {
		sum, err := coord.Run(ctx)
		done <- runResult{sum, err}
	}()

	for r := range l.cfg.Run.Ranks {
		args := []string{"worker", "--coordinator", coord.Addr().String(), "--rank", strconv.Itoa(r),
			"--world", strconv.Itoa(l.cfg.Run.Ranks), "--local-ranks", strconv.Itoa(l.cfg.Run.Ranks), "--config", cfgFile}
		if l.verbosity > 0 {
			args = append(args, "-"+strings.Repeat("v", l.verbosity))
		}
		if err := kids.start(exe, args, childEnv(secret), fmt.Sprintf("rank %d", r), l.stderr); err != nil {
			cancel(fmt.Errorf("start the worker of rank %d: %w", r, err))
			break
		}
	}

	var res runResult
	interrupts := 0
wait:
	for {
		select {
		case res = <-done:
			break wait
		case sig := <-sigs:
			interrupts++
			if interrupts == 1 {
				prog.line(fmt.Sprintf("%v: stopping after the plans in flight; saving a checkpoint (again to kill)", sig))
				coord.Stop()
				continue
			}
			prog.line(fmt.Sprintf("%v again: killing the workers", sig))
			// Cancel first, so the run ends as abandoned rather than as
			// every rank lost.
			cancel(errors.New("interrupted twice: the workers were killed"))
			kids.killAll()
		case ex := <-kids.exits:
			select {
			case <-formed:
				// After formation the coordinator sees the lost link and
				// carries on without the rank.
			default:
				cancel(fmt.Errorf("the worker of %s exited (%v) before the cohort formed", ex.name, ex.err))
			}
		}
	}

	// The coordinator has let the workers go (or given up): they get a
	// grace period to exit on their own, then are killed. Workers of a run
	// that never formed are only retrying their connection.
	grace := time.Second
	select {
	case <-formed:
		grace = childExitGrace
	default:
	}
	kids.waitAll(grace, sigs)
	prog.close()
	return l.report(res.sum, res.err)
}

// report prints the run's outcome and returns the exit status.
func (l *launcher) report(sum *coordinator.Summary, err error) int {
	if sum == nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
		return exitFailed
	}
	msg := fmt.Sprintf("run %s", sum.Status)
	if n := len(sum.Epochs); n > 0 {
		if acc := sum.Epochs[n-1].Accuracy; acc != nil {
			msg += fmt.Sprintf("; final test accuracy %.2f%%", 100**acc)
		}
	}
	if sum.Checkpoint != "" {
		msg += "; last checkpoint " + sum.Checkpoint
	}
	fmt.Println(msg)
	switch sum.Status {
	case coordinator.StatusCompleted:
		return exitCompleted
	case coordinator.StatusStopped:
		if sum.Checkpoint != "" {
			fmt.Printf("resume with: cohort run --resume %s\n", sum.Checkpoint)
		}
		return exitStopped
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort run: %v\n", err)
	}
	return exitFailed
}

// childEnv is the workers' environment: the run's secret through the
// environment (never argv), no other secret source that would win over it,
// and the marker that makes them leave Ctrl-C to the launcher.
func childEnv(secret []byte) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, envSecret+"=") || strings.HasPrefix(kv, envSecretFile+"=") || strings.HasPrefix(kv, envRunChild+"=")
	})
	return append(env, envSecret+"="+string(secret), envRunChild+"=1")
}

// childExit is a worker that ended.
type childExit struct {
	name string
	err  error
}

// children are the run's worker processes. Each runs in its own process
// group, so a terminal's Ctrl-C reaches only the launcher, and is sent
// SIGTERM if the launcher dies (Pdeathsig). One goroutine per child waits
// for it; wg joins them.
type children struct {
	mu    sync.Mutex
	procs []*child
	exits chan childExit
	wg    sync.WaitGroup
}

type child struct {
	cmd    *exec.Cmd
	reaped bool // guarded by children.mu
}

func newChildren(n int) *children {
	return &children{exits: make(chan childExit, n)}
}

// start runs a worker whose output lines go to logs, each prefixed with
// its name.
func (c *children) start(exe string, args, env []string, name string, logs io.Writer) error {
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	pw := &prefixWriter{prefix: "[" + name + "] ", w: logs}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// A plugin that inherited the output pipe must not hold up Wait.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	ch := &child{cmd: cmd}
	c.mu.Lock()
	c.procs = append(c.procs, ch)
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := cmd.Wait()
		pw.flush()
		c.mu.Lock()
		ch.reaped = true
		c.mu.Unlock()
		select {
		case c.exits <- childExit{name: name, err: err}:
		default: // more exits than ranks cannot happen; never block
		}
	}()
	return nil
}

// killAll kills the process group of every worker not yet reaped (the
// worker and the plugins it started) and waits until all are reaped. A
// reaped worker's group is left alone: its id may name another group by
// now, and its plugins exit when it does.
func (c *children) killAll() {
	c.mu.Lock()
	for _, ch := range c.procs {
		if !ch.reaped {
			syscall.Kill(-ch.cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// waitAll waits up to grace for every worker to exit, then kills the rest.
// A signal cuts the wait short.
func (c *children) waitAll(grace time.Duration, sigs <-chan os.Signal) {
	all := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(all)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-all:
	case <-timer.C:
	case <-sigs:
	}
	c.killAll()
	<-all
}

// prefixWriter writes whole lines, each with a prefix, so the workers'
// logs can share one stream and stay readable.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.w.Write(append([]byte(p.prefix), p.buf[:i+1]...))
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func (p *prefixWriter) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) > 0 {
		p.w.Write(append(append([]byte(p.prefix), p.buf...), '\n'))
		p.buf = nil
	}
}

// lockedWriter serialises writes from many goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// String returns what was written, when the sink is a buffer.
func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.w.(fmt.Stringer); ok {
		return s.String()
	}
	return ""
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressPrinter shows a run's progress: a line per event, and a
// progress bar redrawn in place when the output is a terminal. Reports
// arrive on the coordinator's loop; a goroutine of its own does the
// writing, so a slow terminal never holds the run up.
type progressPrinter struct {
	out   io.Writer
	tty   bool
	ch    chan string
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	shut  bool
	start time.Time
}

func newProgressPrinter(out io.Writer, tty bool) *progressPrinter {
	p := &progressPrinter{out: out, tty: tty, ch: make(chan string, 256), done: make(chan struct{}), start: time.Now()}
	go p.loop()
	return p
}

// barPrefix marks a message that replaces the bar instead of adding a line.
const barPrefix = "\x00bar:"

func (p *progressPrinter) loop() {
	defer close(p.done)
	bar := false
	for s := range p.ch {
		if b, ok := strings.CutPrefix(s, barPrefix); ok {
			fmt.Fprintf(p.out, "\r\x1b[K%s", b)
			bar = true
			continue
		}
		if bar {
			fmt.Fprint(p.out, "\r\x1b[K")
			bar = false
		}
		fmt.Fprintln(p.out, s)
	}
	if bar {
		fmt.Fprintln(p.out)
	}
}

// send queues s; a bar update is dropped when the printer is behind, a
// line never is.
func (p *progressPrinter) send(s string, droppable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shut {
		return
	}
	if droppable {
		select {
		case p.ch <- s:
		default:
		}
		return
	}
	p.ch <- s
}

func (p *progressPrinter) line(s string) { p.send(s, false) }

func (p *progressPrinter) close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.shut = true
		close(p.ch)
		p.mu.Unlock()
		<-p.done
	})
}

func (p *progressPrinter) report(pr coordinator.Progress) {
	switch pr.Kind {
	case coordinator.ProgressFormed:
		p.line(fmt.Sprintf("cohort formed: %d ranks in %.1fs", pr.World, time.Since(p.start).Seconds()))
	case coordinator.ProgressSamples:
		if p.tty && pr.Total > 0 {
			const width = 30
			frac := min(float64(pr.Done)/float64(pr.Total), 1)
			n := int(frac * width)
			p.send(fmt.Sprintf("%sepoch %d/%d [%s%s] %3.0f%%  %d/%d samples", barPrefix, pr.Epoch+1, pr.Epochs,
				strings.Repeat("#", n), strings.Repeat("-", width-n), 100*frac, pr.Done, pr.Total), true)
		}
	case coordinator.ProgressEpoch:
		p.line(epochLine(pr))
	case coordinator.ProgressMembership:
		e := pr.Event
		p.line(fmt.Sprintf("rank %d %s in epoch %d: %s (%d of %d ranks live)", e.Rank, e.Event, e.Epoch+1, e.Reason, pr.Live, pr.World))
	case coordinator.ProgressCheckpoint:
		p.line("checkpoint " + pr.Checkpoint)
	}
}

// epochLine is one finished epoch: loss, accuracy when the trainer
// evaluates, throughput and the cost of syncing.
func epochLine(pr coordinator.Progress) string {
	s := pr.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d/%d  loss %.4f", s.Epoch+1, pr.Epochs, s.Loss)
	if s.EvalLoss != nil {
		fmt.Fprintf(&b, "  eval loss %.4f", *s.EvalLoss)
	}
	if s.Accuracy != nil {
		fmt.Fprintf(&b, "  accuracy %.2f%%", 100**s.Accuracy)
	}
	rate := 0.0
	if s.Seconds > 0 {
		rate = float64(s.Samples) / s.Seconds
	}
	fmt.Fprintf(&b, "  %d samples  %.0f samples/s  %.1fs", s.Samples, rate, s.Seconds)
	if s.Rounds == 0 {
		b.WriteString("  no rounds") // a lone rank's rounds would change nothing
	} else {
		fmt.Fprintf(&b, "  %d rounds  sync %.1f ms/round  wait %.1f ms", s.Rounds, s.MeanRoundMS, s.WaitAtSyncMS)
	}
	return b.String()
}

// writeConfigHCL writes cfg as an HCL config file the workers load.
func writeConfigHCL(path string, cfg *config.Config) error {
	src, err := configHCL(cfg)
	if err != nil {
		return fmt.Errorf("write the run's config: %w", err)
	}
	if err := os.WriteFile(path, src, 0o644); err != nil {
		return fmt.Errorf("write the run's config: %w", err)
	}
	return nil
}

// configHCL renders cfg in the config file's syntax, so what the launcher
// resolved (file, defaults, flags) is exactly what every worker reads.
func configHCL(cfg *config.Config) ([]byte, error) {
	var b bytes.Buffer
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	q := hclString
	c := cfg.Coordinator
	w("# Written by cohort run: the run's effective configuration.\n\n")
	w("run {\n  ranks  = %d\n  epochs = %d\n  seed   = %d\n  out    = %s\n}\n\n", cfg.Run.Ranks, cfg.Run.Epochs, cfg.Run.Seed, q(cfg.Run.Out))
	w("coordinator {\n")
	w("  listen            = %s\n", q(c.Listen))
	w("  heartbeat_timeout = %s\n", q(c.HeartbeatTimeout.String()))
	w("  formation_timeout = %s\n", q(c.FormationTimeout.String()))
	w("  policy            = %s\n", q(string(c.Policy)))
	w("  sync_every        = %d\n", c.SyncEvery)
	w("  min_ranks         = %d\n", c.MinRanks)
	w("  checkpoint_every  = %d\n", c.CheckpointEvery)
	w("  chunk_batches     = %d\n", c.ChunkBatches)
	w("  overhead_target   = %s\n", strconv.FormatFloat(c.OverheadTarget, 'g', -1, 64))
	w("  easgd_alpha       = %s\n", strconv.FormatFloat(c.EASGDAlpha, 'g', -1, 64))
	w("}\n\n")
	wk := cfg.Worker
	w("worker {\n  liveness_timeout = %s\n  connect_timeout  = %s\n  plugin_dir       = %s\n  shutdown_grace   = %s\n}\n\n",
		q(wk.LivenessTimeout.String()), q(wk.ConnectTimeout.String()), q(wk.PluginDir), q(wk.ShutdownGrace.String()))
	for _, p := range []struct {
		kind string
		config.Plugin
	}{{"trainer", cfg.Trainer}, {"averager", cfg.Averager}} {
		w("%s %s {\n", p.kind, q(p.Name))
		var settings map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(p.Settings))
		dec.UseNumber()
		if err := dec.Decode(&settings); err != nil {
			return nil, fmt.Errorf("%s %q settings: %w", p.kind, p.Name, err)
		}
		keys := make([]string, 0, len(settings))
		for k := range settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !hclIdent.MatchString(k) {
				return nil, fmt.Errorf("%s %q: setting %q is not an HCL attribute name", p.kind, p.Name, k)
			}
			v, err := hclValue(settings[k])
			if err != nil {
				return nil, fmt.Errorf("%s %q setting %s: %w", p.kind, p.Name, k, err)
			}
			w("  %s = %s\n", k, v)
		}
		w("}\n\n")
	}
	return b.Bytes(), nil
}

var hclIdent = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// hclValue renders one JSON value as an HCL expression.
func hclValue(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	var b strings.Builder
	if err := writeHCLValue(&b, v); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeHCLValue(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case json.Number:
		b.WriteString(x.String())
	case string:
		b.WriteString(hclString(x))
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeHCLValue(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(hclString(k))
			b.WriteString(" = ")
			if err := writeHCLValue(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("cannot write a %T in HCL", v)
	}
	return nil
}

// hclString quotes s as an HCL string literal: JSON-style escapes, and the
// template introducers ${ and %{ doubled so they stay literal.
func hclString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04x`, r)
		case (r == '$' || r == '%') && i+1 < len(s) && s[i+1] == '{':
			b.WriteRune(r)
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
