// Command cohort runs data-parallel training: `cohort run` trains on this
// machine with a local coordinator and N rank workers; `cohort coordinator`
// and `cohort node` (a host's ranks) or `cohort worker` (one rank) run the
// halves apart for multi-host runs.
package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Exit statuses: exitCodes says what each means.
const (
	exitCompleted = 0
	exitFailed    = 1
	exitUsage     = 2
	exitStopped   = 130 // the shell's code for "ended by SIGINT"
)

// exitCodes is the one table of cohort's exit statuses: every command ends
// with one of them, and every command's --help (and the README) prints it.
var exitCodes = []struct {
	code    int
	meaning string
}{
	{exitCompleted, "done: the run completed, or the command did what it was asked"},
	{exitFailed, "failed: the run started and failed (a failed run that saved names its checkpoint), or something outside the config failed (an address in use, a missing secret, an unreadable file)"},
	{exitUsage, "wrong command line, config file or plugin block (nothing started): the message names the flag, or the file, line and key"},
	{exitStopped, "stopped by Ctrl-C or SIGTERM after saving a checkpoint: --resume continues it"},
}

// exitTable is exitCodes as --help prints it.
func exitTable() string {
	var b strings.Builder
	b.WriteString("Exit status:\n")
	for _, e := range exitCodes {
		fmt.Fprintf(&b, "  %-4d %s\n", e.code, e.meaning)
	}
	return b.String()
}

func main() {
	// cohort run (with its coordinator) and cohort worker hold a live heap
	// of 3 to 5 MB that stays flat however long the run. At the default
	// GOGC of 100 the heap may double before a collection, and the pages
	// of each peak stay resident until the scavenger returns what lies
	// above that goal, so their resident memory wandered by about 1 MB
	// around a flat live heap. 25 narrows that band to a quarter, for a
	// collection of a heap this small every MB or so of allocation. GOGC,
	// when set, still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
	os.Exit(execute(os.Args[1:]))
}

// execute runs cohort with the command line args and returns its exit
// status.
func execute(args []string) int {
	root := newRootCommand()
	root.SetArgs(singleDashJSON(args))
	cmd, err := root.ExecuteC()
	return exitStatus(cmd, err)
}

// singleDashJSON lets -json stand for --json, the spelling of Go's own
// tools (go list -json), which pflag would read as -j -s -o -n.
func singleDashJSON(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if a == "-json" {
			out[i] = "--json"
		}
	}
	return out
}

// globals are the flags every command shares.
type globals struct {
	configPath string
	verbosity  int
}

func newRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "cohort",
		Short: "Data-parallel training: a coordinator and N rank workers",
		Long: `cohort runs data-parallel training. 'cohort run' trains on this machine: a
coordinator in process and N 'cohort worker' subprocesses. For a run across
hosts, 'cohort coordinator' runs on one and 'cohort node' on each (or
'cohort worker' once per rank). Trainers and averagers are plugins
('cohort plugins' lists them); a config file picks them and sets the run's
keys.`,
		Version: cohortVersion(),
		// Errors and usage are printed once, by exitStatus.
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(*cobra.Command, []string) error {
			return usageError("a command is needed")
		},
	}
	// `cohort completion bash|zsh|fish|powershell` is cobra's: it
	// completes commands, flags and the config file's name.
	root.SetVersionTemplate("cohort {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{code: exitUsage, err: err} })
	f := root.PersistentFlags()
	f.StringVar(&g.configPath, "config", "", "HCL config file (default: the built-in configuration; cohort coordinator needs one)")
	f.CountVarP(&g.verbosity, "verbose", "v", "log more: -v, -vv, -vvv (up to trace)")
	_ = root.MarkPersistentFlagFilename("config", "hcl")
	root.AddCommand(
		newRunCommand(g),
		newCoordinatorCommand(g),
		newWorkerCommand(g),
		newNodeCommand(g),
		newPluginsCommand(g),
		newTLSCommand(),
		newValidateCommand(g),
		&cobra.Command{
			Use:   "version",
			Short: "Print cohort's version, the plugin protocol versions it speaks and its plugin SDK's version",
			Args:  noArgs,
			Run: func(cmd *cobra.Command, _ []string) {
				fmt.Fprint(cmd.OutOrStdout(), versionText(plugin.ProtocolRange(), plugin.SDKModule+"@v"+plugin.SDKVersion))
			},
		},
	)
	withExitTable(root)
	return root
}

// withExitTable ends the help of cmd and every command under it with the
// exit status table.
func withExitTable(cmd *cobra.Command) {
	cmd.Long = strings.TrimRight(cmp.Or(cmd.Long, cmd.Short), "\n") + "\n\n" + exitTable()
	for _, c := range cmd.Commands() {
		withExitTable(c)
	}
}

// loadConfig is the config a command runs with: the --config file, else
// the built-in one.
//
// A relative worker.plugin_lock is made absolute, beside the config file
// (in the working directory for the built-in config), so the lock belongs
// to the run's config and the copy `cohort run` writes for its workers
// names the same file.
func (g *globals) loadConfig() (*config.Config, error) {
	cfg := config.Default()
	base := "."
	if g.configPath != "" {
		var err error
		if cfg, err = config.Load(g.configPath); err != nil {
			return nil, configError(err)
		}
		base = filepath.Dir(g.configPath)
	}
	if lock := cfg.Worker.PluginLock; lock != "" && !filepath.IsAbs(lock) {
		abs, err := filepath.Abs(filepath.Join(base, lock))
		if err != nil {
			return nil, configError(fmt.Errorf("worker.plugin_lock %q: %w", lock, err))
		}
		cfg.Worker.PluginLock = abs
	}
	return cfg, nil
}

// logLevels are a command's log levels at -v counts 0 to 3.
type logLevels [4]hclog.Level

// newLogger is the logger of a command, at the level its -v count picks.
func (g *globals) newLogger(out io.Writer, levels logLevels) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "cohort", Level: levels[min(g.verbosity, 3)], Output: out})
}

// verbosityFlag passes the -v count on to a child cohort process.
func (g *globals) verbosityFlag() []string {
	if g.verbosity == 0 {
		return nil
	}
	return []string{"-" + strings.Repeat("v", min(g.verbosity, 3))}
}

// relayOnOneP runs the Go side of this process on one P unless $GOMAXPROCS
// says otherwise. The coordinator of a local run and each worker only
// relay (plans, reports, rounds' bookkeeping); with one P their goroutines
// hand work to each other on one thread instead of waking idle threads on
// the cores the trainers compute on. Measured on a 2-core machine: 1-rank
// training 3-15% faster with the workers on one P, and a lone rank's loop
// losing about 3% to a stopped and resumed coordinator with the default P
// count against 0-1% with one.
func relayOnOneP() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// exitError ends cohort with code; err, when set, is printed first.
type exitError struct {
	code int
	err  error
	// noUsage leaves the usage text out after a usage error whose
	// message says all (one that names lines of a config file).
	noUsage bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// failed is a command that failed with err (nil: already reported).
func failed(err error) error { return &exitError{code: exitFailed, err: err} }

// configError is a config cohort cannot run with: exit status 2, like a
// usage error, but err (file, line and key) says what to fix.
func configError(err error) error { return &exitError{code: exitUsage, err: err, noUsage: true} }

// usageError is a command line cohort cannot run.
func usageError(format string, a ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, a...)}
}

// noArgs refuses positional arguments: every command takes flags only.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError("unexpected argument %q", args[0])
	}
	return nil
}

// exitStatus prints what err says and returns the exit status it carries.
// An error cobra made itself (an unknown command, flag or bad flag value)
// is a usage error.
func exitStatus(cmd *cobra.Command, err error) int {
	if err == nil {
		return exitCompleted
	}
	var e *exitError
	if !errors.As(err, &e) {
		e = &exitError{code: exitUsage, err: err}
	}
	if e.err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", cmd.CommandPath(), e.err)
		if e.code == exitUsage && !e.noUsage {
			fmt.Fprintf(os.Stderr, "\n%s", cmd.UsageString())
		}
	}
	return e.code
}
