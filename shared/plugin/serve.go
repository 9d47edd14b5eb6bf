package plugin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
)

// LogLevelEnv names the environment variable that sets a plugin's log level
// (trace, debug, info, warn, error, off). cohort's plugin host sets it to
// its own level (raised by -v) unless the rank's environment already does.
const LogLevelEnv = "COHORT_LOG_LEVEL"

// parentPollInterval is how often a plugin checks that its host is alive
// where it cannot wait for the host's exit (see parentExit).
const parentPollInterval = 300 * time.Millisecond

// ServeOptions say what a plugin binary serves. Exactly one of Trainer and
// Averager is set.
type ServeOptions struct {
	// Name is the plugin's logger name; empty means the binary's name.
	Name string
	// Trainer builds the trainer to serve; it runs once, before the
	// handshake, with the plugin's logger.
	Trainer func(hclog.Logger) (Trainer, error)
	// Averager builds the averager to serve, likewise.
	Averager func(hclog.Logger) (Averager, error)
	// Protocols are the plugin protocol versions to serve; empty means all
	// of Protocols(), so a host negotiates the newest it speaks too. A
	// plugin that must keep to an older contract lists it alone ([]int{1}:
	// an averager that gets no Relay).
	Protocols []int
}

// Serve runs a plugin: it does not return until the host is done with it,
// and then the process exits. In order, it
//
//   - asks the kernel to kill the process when its parent thread dies, and
//     watches os.Getppid, exiting as soon as the parent changes (go-plugin
//     leaves orphans behind when the host is SIGKILLed; the kernel signal
//     alone follows the thread that forked, not the host process);
//   - protects the handshake: the real stdout moves to a private
//     descriptor and fd 1 becomes a copy of stderr, so whatever writes to
//     stdout from here on, Go or C (libtorch prints), lands on stderr;
//   - logs hclog JSON to stderr at $COHORT_LOG_LEVEL (default info), which
//     the host's go-plugin forwards under the plugin's name;
//   - refuses to run when not started by a cohort host, then runs the
//     factory; a factory error is logged and the process exits with status
//     1 before any handshake;
//   - serves the one plugin kind over gRPC with MaxMessageBytes limits,
//     go-plugin's health service and the protocol versions of
//     ServeOptions.Protocols (all this SDK speaks by default).
func Serve(o ServeOptions) {
	ppid := os.Getppid()
	setParentDeathSignal()
	if os.Getppid() != ppid {
		os.Exit(1) // the parent died before the kernel was told to notice
	}

	handshake, err := protectStdout(1, 2)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cohort plugin: protect the handshake stream: %v\n", err)
		os.Exit(1)
	}

	name := o.Name
	if name == "" {
		name = filepath.Base(os.Args[0])
	}
	logger := newLogger(name, os.Stderr)

	waitExit, _ := parentExit(ppid)
	go watchParent(ppid, os.Getppid, waitExit, parentPollInterval, func() {
		logger.Warn("host process is gone; exiting", "parent_pid", ppid)
		os.Exit(1)
	})

	hs := Handshake()
	if os.Getenv(hs.MagicCookieKey) != hs.MagicCookieValue {
		fmt.Fprintf(os.Stderr, "%s is a cohort plugin; cohort starts it, it is not meant to be run directly.\n", name)
		os.Exit(1)
	}

	kind, p, err := build(o, logger)
	protocols, perr := checkProtocols(o.Protocols)
	if err == nil {
		err = perr
	}
	if err != nil {
		logger.Error("plugin failed to start", "error", err)
		os.Exit(1)
	}

	// Only go-plugin's handshake line goes to the real stdout: it prints it
	// to os.Stdout, then points os.Stdout at its own stdio stream.
	os.Stdout = handshake
	logger.Debug("serving", "kind", kind, "protocols", protocols)
	goplugin.Serve(serveConfig(kind, p, protocols, logger))
	os.Exit(0)
}

// build checks the options and runs the one factory that is set.
func build(o ServeOptions, logger hclog.Logger) (string, goplugin.Plugin, error) {
	switch {
	case o.Trainer != nil && o.Averager != nil:
		return "", nil, errors.New("plugin.ServeOptions sets both Trainer and Averager; a plugin serves one kind")
	case o.Trainer != nil:
		impl, err := o.Trainer(logger)
		if err != nil {
			return "", nil, fmt.Errorf("build trainer: %w", err)
		}
		if impl == nil {
			return "", nil, errors.New("build trainer: the factory returned no trainer")
		}
		return KindTrainer, TrainerPlugin{Impl: impl}, nil
	case o.Averager != nil:
		impl, err := o.Averager(logger)
		if err != nil {
			return "", nil, fmt.Errorf("build averager: %w", err)
		}
		if impl == nil {
			return "", nil, errors.New("build averager: the factory returned no averager")
		}
		return KindAverager, AveragerPlugin{Impl: impl}, nil
	}
	return "", nil, errors.New("plugin.ServeOptions sets neither Trainer nor Averager")
}

// serveConfig is the go-plugin server side of one plugin of the given kind,
// under each of the protocol versions.
func serveConfig(kind string, p goplugin.Plugin, protocols []int, logger hclog.Logger) *goplugin.ServeConfig {
	sets := map[int]goplugin.PluginSet{}
	for _, v := range protocols {
		vp := p
		if a, ok := p.(AveragerPlugin); ok {
			a.Protocol = v
			vp = a
		}
		sets[v] = goplugin.PluginSet{kind: vp}
	}
	return &goplugin.ServeConfig{
		HandshakeConfig:  Handshake(),
		VersionedPlugins: sets,
		GRPCServer:       newGRPCServer,
		Logger:           logger,
	}
}

// newLogger is a plugin's logger: hclog JSON, which the host's go-plugin
// parses and re-logs with the plugin's name and each line's level.
func newLogger(name string, w io.Writer) hclog.Logger {
	raw := os.Getenv(LogLevelEnv)
	level := hclog.Info
	if raw != "" {
		level = hclog.LevelFromString(raw)
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      level,
		Output:     w,
		JSONFormat: true,
	})
	if level == hclog.NoLevel {
		logger.SetLevel(hclog.Info)
		logger.Warn("unknown log level; using info", "env", LogLevelEnv, "value", strings.TrimSpace(raw))
	}
	return logger
}

// watchParent calls gone once getppid stops returning ppid: once
// waitExit returns (see parentExit), or polling every interval where
// waitExit is nil or fails. It never returns otherwise: a plugin lives as
// long as its host.
func watchParent(ppid int, getppid func() int, waitExit func() error, interval time.Duration, gone func()) {
	if waitExit != nil {
		// Checked after the pidfd was opened: a host gone before that left
		// a recycled pid, or none.
		if getppid() != ppid || waitExit() == nil {
			gone()
			return
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		if getppid() != ppid {
			gone()
			return
		}
	}
}
