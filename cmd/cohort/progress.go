package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cohortdl/cohort/core/coordinator"
)

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

// outcome prints how a run ended and returns what cohort exits with: nil
// when it completed, exit status 130 when it stopped, 1 (and err) when it
// failed. resume is the command that continues a run that saved a
// checkpoint, less its --resume flag.
func outcome(w io.Writer, sum *coordinator.Summary, err error, resume string) error {
	if sum == nil {
		return failed(err)
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
	fmt.Fprintln(w, msg)
	if sum.Status == coordinator.StatusCompleted {
		return nil
	}
	// A stopped run, and a failed one that saved first (too few ranks
	// left, a stalled session), continue from their checkpoint.
	if sum.Checkpoint != "" {
		fmt.Fprintf(w, "resume with: %s --resume %s\n", resume, sum.Checkpoint)
	}
	if sum.Status == coordinator.StatusStopped {
		return &exitError{code: exitStopped}
	}
	return failed(err)
}
