package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/sys/unix"

	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// isTerminal reports whether f is a terminal with a size: a pseudo-terminal
// of zero columns (script(1) without a terminal of its own) shows no bar.
func isTerminal(f *os.File) bool {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	return err == nil && ws.Col > 0
}

// progressEvery is how often the progress line is printed when the output
// is not a terminal: often enough to see a run is alive, rare enough for a
// log file.
const progressEvery = 10 * time.Second

// progressPrinter shows a run's progress: a line per event, and during an
// epoch a progress bar (mpb) with the rate, the time left and the latest
// loss when the output is a terminal, else the same figures as a line
// every progressEvery. Reports arrive on the coordinator's loop; a
// goroutine of its own does the writing, so a slow terminal never holds
// the run up.
type progressPrinter struct {
	out   io.Writer
	tty   bool
	every time.Duration
	ch    chan progressMsg
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	shut  bool
	start time.Time

	// ep is the epoch in progress; the bar's decorators read it from
	// mpb's goroutine.
	epMu sync.Mutex
	ep   *epochProgress
}

// progressMsg is a line to print, or a sample count to show.
type progressMsg struct {
	line    string
	samples *coordinator.Progress
	endsBar bool // the line closes the epoch's bar
}

// epochProgress is what the bar or the periodic line shows of one epoch.
type epochProgress struct {
	epoch       uint64
	epochs      int
	start       time.Time
	first, done uint64 // samples done when it was first seen, and now
	total       uint64
	loss        *float64
}

// newProgressPrinter starts a printer; without a terminal it prints the
// epoch's progress every period.
func newProgressPrinter(out io.Writer, tty bool, every time.Duration) *progressPrinter {
	p := &progressPrinter{out: out, tty: tty, every: every, ch: make(chan progressMsg, 256), done: make(chan struct{}), start: time.Now()}
	go p.loop()
	return p
}

func (p *progressPrinter) loop() {
	defer close(p.done)
	var bars *mpb.Progress
	var bar *mpb.Bar
	// endBar completes the epoch's bar and waits until mpb has drawn it
	// for the last time, so the next line does not race its redraw.
	endBar := func() {
		if bars != nil {
			bar.SetTotal(-1, true)
			bars.Wait()
			bars, bar = nil, nil
		}
	}
	defer endBar()
	tick := time.NewTicker(p.every)
	defer tick.Stop()
	for {
		select {
		case m, ok := <-p.ch:
			if !ok {
				return
			}
			if m.samples != nil {
				if p.observe(*m.samples) && p.tty {
					endBar()
				}
				if p.tty && bars == nil && m.samples.Total > 0 {
					bars, bar = p.newBar(*m.samples)
				}
				if bar != nil {
					bar.SetCurrent(int64(min(m.samples.Done, m.samples.Total)))
				}
				continue
			}
			if m.endsBar {
				endBar()
				p.epMu.Lock()
				p.ep = nil
				p.epMu.Unlock()
			}
			if bars != nil {
				// mpb prints it above the bar at its next redraw.
				fmt.Fprintln(bars, m.line)
				continue
			}
			fmt.Fprintln(p.out, m.line)
		case <-tick.C:
			if !p.tty {
				if s := p.status(); s != "" {
					fmt.Fprintln(p.out, s)
				}
			}
		}
	}
}

// observe records a sample count; it reports whether the count starts a
// new epoch.
func (p *progressPrinter) observe(pr coordinator.Progress) bool {
	p.epMu.Lock()
	defer p.epMu.Unlock()
	fresh := p.ep == nil || p.ep.epoch != pr.Epoch
	if fresh {
		p.ep = &epochProgress{epoch: pr.Epoch, epochs: pr.Epochs, start: time.Now(), first: pr.Done}
	}
	p.ep.done, p.ep.total, p.ep.loss = pr.Done, pr.Total, pr.Loss
	return fresh
}

func (p *progressPrinter) newBar(pr coordinator.Progress) (*mpb.Progress, *mpb.Bar) {
	bars := mpb.New(mpb.WithOutput(p.out), mpb.WithWidth(100), mpb.WithRefreshRate(200*time.Millisecond))
	bar := bars.AddBar(int64(pr.Total),
		mpb.PrependDecorators(decor.Any(func(decor.Statistics) string { return epochName(pr.Epoch, pr.Epochs) }, decor.WCSyncSpaceR)),
		mpb.AppendDecorators(
			decor.Percentage(decor.WCSyncSpace),
			decor.Any(func(decor.Statistics) string { return p.figures() }, decor.WCSyncSpace),
		),
		mpb.BarRemoveOnComplete(),
	)
	return bars, bar
}

// epochName is the epoch of index epoch (from 0, as the coordinator counts)
// as the console and summary.json number it: from 1.
func epochName(epoch uint64, epochs int) string {
	return fmt.Sprintf("epoch %d/%d", epoch+1, epochs)
}

// figures are the epoch's samples, rate, time left and latest loss.
func (p *progressPrinter) figures() string {
	p.epMu.Lock()
	defer p.epMu.Unlock()
	e := p.ep
	if e == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d/%d samples", e.done, e.total)
	if secs := time.Since(e.start).Seconds(); secs > 0.25 && e.done > e.first {
		rate := float64(e.done-e.first) / secs
		left := time.Duration(float64(e.total-min(e.done, e.total)) / rate * float64(time.Second))
		fmt.Fprintf(&b, "  %.0f samples/s  ETA %s", rate, left.Round(time.Second))
	}
	if e.loss != nil {
		fmt.Fprintf(&b, "  loss %.4f", *e.loss)
	}
	return b.String()
}

// status is the periodic line of the epoch in progress; empty between
// epochs.
func (p *progressPrinter) status() string {
	p.epMu.Lock()
	e := p.ep
	p.epMu.Unlock()
	if e == nil || e.total == 0 {
		return ""
	}
	return fmt.Sprintf("%s  %3.0f%%  %s", epochName(e.epoch, e.epochs), 100*min(float64(e.done)/float64(e.total), 1), p.figures())
}

// send queues m; a sample count is dropped when the printer is behind, a
// line never is.
func (p *progressPrinter) send(m progressMsg) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shut {
		return
	}
	if m.samples != nil {
		select {
		case p.ch <- m:
		default:
		}
		return
	}
	p.ch <- m
}

func (p *progressPrinter) line(s string) { p.send(progressMsg{line: s}) }

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
		p.line(fmt.Sprintf("cohort formed: %s in %.1fs", count(pr.World, "rank"), time.Since(p.start).Seconds()))
	case coordinator.ProgressSamples:
		p.send(progressMsg{samples: &pr})
	case coordinator.ProgressEpoch:
		p.send(progressMsg{line: epochLine(pr), endsBar: true})
	case coordinator.ProgressMembership:
		e := pr.Event
		p.line(fmt.Sprintf("rank %d %s in epoch %d: %s (%d of %s live)", e.Rank, e.Event, e.Epoch, e.Reason, pr.Live, count(pr.World, "rank")))
	case coordinator.ProgressCheckpoint:
		p.line("checkpoint " + pr.Checkpoint)
	case coordinator.ProgressModel:
		p.line("trained model kept in " + pr.Model)
	}
}

// epochLine is one finished epoch: loss, accuracy when the epoch was
// evaluated (the trainer has a test split and coordinator.eval_every
// chose it), throughput and the cost of syncing.
func epochLine(pr coordinator.Progress) string {
	s := pr.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d/%d  loss %.4f", s.Epoch, pr.Epochs, s.Loss)
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
	fmt.Fprintf(&b, "  %s  %.0f samples/s  %.1fs", count(s.Samples, "sample"), rate, s.Seconds)
	if s.Rounds == 0 {
		b.WriteString("  no rounds") // a lone rank's rounds would change nothing
	} else {
		fmt.Fprintf(&b, "  %s  sync %.1f ms/round  wait %.1f ms", count(s.Rounds, "round"), s.MeanRoundMS, s.WaitAtSyncMS)
	}
	return b.String()
}

// outcome prints how a run ended and returns what cohort exits with: nil
// when it completed, exit status 130 when it stopped, 1 (and err) when it
// failed. resume is the command that continues a run that saved a
// checkpoint, less its --resume flag.
func outcome(w io.Writer, sum *record.Summary, err error, resume string) error {
	if sum == nil {
		return failed(err)
	}
	msg := fmt.Sprintf("run %s", sum.Status) + accuracyNote(sum.Epochs)
	if sum.Checkpoint != "" {
		msg += "; last checkpoint " + sum.Checkpoint
	}
	fmt.Fprintln(w, msg)
	if sum.Status == record.StatusCompleted {
		return nil
	}
	// A stopped run, and a failed one that saved first (too few ranks
	// left, a stalled session), continue from their checkpoint.
	if sum.Checkpoint != "" {
		fmt.Fprintf(w, "resume with: %s --resume %s\n", resume, sum.Checkpoint)
	}
	if sum.Status == record.StatusStopped {
		return &exitError{code: exitStopped}
	}
	return failed(err)
}

// accuracyNote is the outcome line's accuracy: the last epoch's, else
// (a run stopped between evaluations) the last evaluated epoch's, named;
// empty when no epoch was evaluated.
func accuracyNote(epochs []record.EpochSummary) string {
	for i := len(epochs) - 1; i >= 0; i-- {
		e := epochs[i]
		switch {
		case e.Accuracy == nil:
		case i == len(epochs)-1:
			return fmt.Sprintf("; final test accuracy %.2f%%", 100**e.Accuracy)
		default:
			return fmt.Sprintf("; test accuracy %.2f%% after epoch %d", 100**e.Accuracy, e.Epoch)
		}
	}
	return ""
}

// count is n and noun, plural unless n is 1: "1 rank", "4 ranks".
func count[N int | uint32 | uint64](n N, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
