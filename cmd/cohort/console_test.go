package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/cohortdl/cohort/core/coordinator"
	"github.com/cohortdl/cohort/core/coordinator/checkpoint"
	"github.com/cohortdl/cohort/core/coordinator/record"
)

// On a terminal, a default-sized run shows a few lines: the run, the
// formation, a bar per epoch (redrawn in place, with rate, time left and
// loss), the epoch lines and the outcome. The logs go to OUT/logs.
func TestConsoleOnATerminal(t *testing.T) {
	bin := cohortBinary(t)
	out := filepath.Join(t.TempDir(), "run")
	cfg := writeRunConfig(t, "run {\n  epochs = 3\n}", map[string]any{"samples": 2048, "batch_size": 32, "sleep_per_batch": "40ms"})
	cmd := exec.Command(bin, "run", "--config", cfg, "--out", out)
	cmd.Env = append(os.Environ(), envSecret+"=", envSecretFile+"=")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	var screen bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		screen.ReadFrom(tty) // ends with EIO once cohort and its children close the terminal
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cohort run: %v", err)
		}
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		t.Fatal("cohort run did not end within 90s")
	}
	tty.Close()
	<-read
	text := screen.String()
	// What stays on the screen: every line, less those the bar redrew
	// over (mpb moves the cursor up one line per redraw).
	lines := strings.Count(text, "\n") - strings.Count(text, "\x1b[1A")
	t.Logf("%d lines on the screen:\n%s", lines, text)
	if lines >= 30 || lines < 6 {
		t.Errorf("%d lines stay on the screen, want 6 to 29", lines)
	}
	for _, want := range []string{"samples/s", "ETA", "loss", "epoch 3/3  loss", "trained model kept in " + filepath.Join(out, checkpoint.ModelDir), "run completed"} {
		if !strings.Contains(text, want) {
			t.Errorf("the screen never shows %q", want)
		}
	}
	// The mock trainer's checkpoint files, saved by one rank after the
	// last epoch.
	if names, err := os.ReadDir(filepath.Join(out, checkpoint.ModelDir)); err != nil || len(names) == 0 {
		t.Errorf("OUT/model holds %d files (%v), want the trained model", len(names), err)
	}
	s := readSummary(t, out)
	if s.Model != filepath.Join(out, checkpoint.ModelDir) {
		t.Errorf("summary.json names model %q", s.Model)
	}
	// summary.json numbers the epochs as the console does, from 1.
	for i, e := range s.Epochs {
		if e.Epoch != uint64(i+1) || !strings.Contains(text, fmt.Sprintf("epoch %d/3  loss %.4f", e.Epoch, e.Loss)) {
			t.Errorf("summary.json's epoch %d (loss %.4f) is not the console's", e.Epoch, e.Loss)
		}
	}
	if strings.Contains(text, "[INFO]") {
		t.Error("info log lines reach the console without -v")
	}
	for _, f := range []string{"coordinator.log", "rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"} {
		b, err := os.ReadFile(filepath.Join(out, LogsDir, f))
		if err != nil || len(b) == 0 {
			t.Errorf("log %s: %d bytes, %v", f, len(b), err)
		}
		if bytes.Contains(b, []byte("@module")) || bytes.Contains(b, []byte("cohort-trainer-mock:")) {
			t.Errorf("log %s repeats the plugin's own logger name:\n%s", f, b)
		}
	}
}

// Without a terminal, the epoch in progress is a line every period, and
// none between epochs.
func TestProgressLinesWithoutATerminal(t *testing.T) {
	var b bytes.Buffer
	w := &lockedWriter{w: &b}
	p := newProgressPrinter(w, false, 40*time.Millisecond)
	loss := 0.5
	for i := range 10 {
		p.report(coordinator.Progress{Kind: coordinator.ProgressSamples, Epochs: 2, Done: uint64(i+1) * 100, Total: 1000, Loss: &loss})
		time.Sleep(20 * time.Millisecond)
	}
	p.report(coordinator.Progress{Kind: coordinator.ProgressEpoch, Epochs: 2, Summary: &record.EpochSummary{Epoch: 1, Samples: 1000, Seconds: 0.2}})
	time.Sleep(100 * time.Millisecond) // no epoch in progress: no line
	p.close()
	lines := strings.Split(strings.TrimSpace(w.String()), "\n")
	periodic := 0
	for _, l := range lines[:len(lines)-1] {
		if !strings.HasPrefix(l, "epoch 1/2  ") || !strings.Contains(l, "/1000 samples") || !strings.Contains(l, "loss 0.5000") {
			t.Errorf("periodic line %q", l)
		}
		periodic++
	}
	if periodic < 2 || periodic > 6 {
		t.Errorf("%d periodic lines in 200ms at one per 40ms, want 2 to 6:\n%s", periodic, w.String())
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "epoch 1/2  loss") {
		t.Errorf("last line %q, want the epoch's", last)
	}
}

func TestNotQuiet(t *testing.T) {
	cases := []struct {
		line string
		keep bool
	}{
		{"2026-01-01T00:00:00.000Z [INFO]  cohort.worker: ready", false},
		{"2026-01-01T00:00:00.000Z [DEBUG] rank 0 trainer: step", false},
		{"2026-01-01T00:00:00.000Z [TRACE] cohort: x", false},
		{"2026-01-01T00:00:00.000Z [WARN]  rank 0 trainer: slow", true},
		{"2026-01-01T00:00:00.000Z [ERROR] cohort: worker failed", true},
		{"panic: runtime error: index out of range", true},
		{"goroutine 1 [running]:", true},
	}
	for _, tc := range cases {
		if got := notQuiet([]byte(tc.line)); got != tc.keep {
			t.Errorf("notQuiet(%q) = %v, want %v", tc.line, got, tc.keep)
		}
	}
}

// An epoch coordinator.eval_every skipped has no accuracy: its line leaves
// the figure out, and the outcome names the last accuracy there is.
func TestConsoleWithoutEvaluation(t *testing.T) {
	acc, loss := 0.8125, 0.25
	evaluated := record.EpochSummary{Epoch: 2, Loss: 0.5, EvalLoss: &loss, Accuracy: &acc, Samples: 100, Seconds: 1, Rounds: 3}
	skipped := record.EpochSummary{Epoch: 3, Loss: 0.5, Samples: 100, Seconds: 1, Rounds: 3}
	line := epochLine(coordinator.Progress{Epochs: 4, Summary: &skipped})
	if want := "epoch 3/4  loss 0.5000  100 samples"; !strings.HasPrefix(line, want) || strings.Contains(line, "accuracy") || strings.Contains(line, "eval") {
		t.Errorf("skipped epoch's line %q, want it to start %q with no evaluation figures", line, want)
	}
	if line := epochLine(coordinator.Progress{Epochs: 4, Summary: &evaluated}); !strings.Contains(line, "eval loss 0.2500  accuracy 81.25%") {
		t.Errorf("evaluated epoch's line %q", line)
	}

	for _, tc := range []struct {
		name   string
		status string
		epochs []record.EpochSummary
		want   string
	}{
		{"last epoch evaluated", record.StatusCompleted, []record.EpochSummary{skipped, evaluated}, "run completed; final test accuracy 81.25%\n"},
		{"stopped after a skipped epoch", record.StatusStopped, []record.EpochSummary{evaluated, skipped}, "run stopped; test accuracy 81.25% after epoch 2\n"},
		{"never evaluated", record.StatusCompleted, []record.EpochSummary{skipped}, "run completed\n"},
		{"no epoch", record.StatusCompleted, nil, "run completed\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			outcome(&b, &record.Summary{Status: tc.status, Epochs: tc.epochs}, nil, "cohort run")
			if b.String() != tc.want {
				t.Errorf("outcome printed %q, want %q", b.String(), tc.want)
			}
		})
	}
}
