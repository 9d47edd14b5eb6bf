package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
)

// LogsDir is where `cohort run` writes the logs of its coordinator
// (coordinator.log) and of each rank's worker and plugins (rank-N.log),
// under the out directory.
const LogsDir = "logs"

// runLogs are a local run's log files. By default the console gets only
// warnings and errors from them (and anything that is not a log line, a
// panic's trace for one); with -v it gets every line the levels let
// through.
type runLogs struct {
	dir     string
	verbose bool
	console io.Writer
	files   []*os.File
}

func openRunLogs(out string, verbose bool, console io.Writer) (*runLogs, error) {
	dir := filepath.Join(out, LogsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the run's log directory: %w", err)
	}
	return &runLogs{dir: dir, verbose: verbose, console: console}, nil
}

func (l *runLogs) create(name string) (*os.File, error) {
	// Appending: a resumed run adds to the logs of the run it continues.
	f, err := os.OpenFile(filepath.Join(l.dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open a log file: %w", err)
	}
	l.files = append(l.files, f)
	return f, nil
}

// coordinatorLogger logs into coordinator.log at Info (or what -v asks
// for, if more) and onto the console at levels' level for the -v count.
func (l *runLogs) coordinatorLogger(g *globals, levels logLevels) (hclog.Logger, error) {
	f, err := l.create("coordinator.log")
	if err != nil {
		return nil, err
	}
	console := levels[min(g.verbosity, 3)]
	logger := hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "cohort", Level: min(console, hclog.Info), Output: f})
	logger.RegisterSink(hclog.NewSinkAdapter(&hclog.LoggerOptions{Name: "cohort", Level: console, Output: l.console}))
	return logger, nil
}

// rankOutput is where a rank's worker writes: rank-N.log, and its
// warnings and errors (every line with -v) onto the console, prefixed
// with the rank.
func (l *runLogs) rankOutput(rank int) (file *os.File, console *prefixWriter, err error) {
	f, err := l.create(fmt.Sprintf("rank-%d.log", rank))
	if err != nil {
		return nil, nil, err
	}
	pw := &prefixWriter{prefix: fmt.Sprintf("[rank %d] ", rank), w: l.console}
	if !l.verbose {
		pw.keep = notQuiet
	}
	return f, pw, nil
}

func (l *runLogs) close() {
	for _, f := range l.files {
		f.Close()
	}
}

// notQuiet reports whether a worker's output line belongs on a quiet
// console: anything but an hclog line at Trace, Debug or Info.
func notQuiet(line []byte) bool {
	for _, level := range [][]byte{[]byte(" [TRACE] "), []byte(" [DEBUG] "), []byte(" [INFO]  ")} {
		if bytes.Contains(line, level) {
			return false
		}
	}
	return true
}

// printerWriter prints whole lines through the progress printer.
type printerWriter struct{ p *progressPrinter }

func (w printerWriter) Write(b []byte) (int, error) {
	w.p.line(string(bytes.TrimSuffix(b, []byte("\n"))))
	return len(b), nil
}
