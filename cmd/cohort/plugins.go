package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
)

func newPluginsCommand(g *globals) *cobra.Command {
	probe := 10 * time.Second
	cmd := &cobra.Command{
		Use:   "plugins",
		Short: "List the plugins a worker would find; package, sign and install plugins",
		Long: `Lists the trainer and averaging plugins a worker would find (the config's
worker.plugin_dir, then the plugins directory beside the cohort binary, then
PATH): kind, name, the version and protocol each reports (each plugin is
started briefly, for at most --probe-timeout; 0 skips that and shows the
version the plugin lock recorded), whether it passes its SHA256SUMS check,
and its lock state; a locked plugin whose Describe disagrees with its lock
entry (another version, a protocol its package did not list) is refused. A config file picks one of each by name:
trainer "NAME" {} and averager "NAME" {}. The command fails when the
configured trainer or averager is missing or would be refused.

The plugin lock is the file the config's worker.plugin_lock names (default
cohort.lock.json; a relative path is beside the config file, or in the
working directory for the built-in config). 'cohort plugins
install' records there the checksum of each plugin it installs from a
signed package; every worker checks a plugin the lock names against it
before starting it, and refuses a binary swapped since. A missing lock
file locks nothing.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			if err := listPlugins(cmd.Context(), cmd.OutOrStdout(), cfg, probe); err != nil {
				return failed(err)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&probe, "probe-timeout", probe, "how long each plugin may take to start and describe itself; 0: do not start plugins")
	cmd.AddCommand(newKeygenCommand(), newPackageCommand(g), newInstallCommand(g))
	return cmd
}

// listPlugins writes a table of the plugins a worker with cfg would find,
// and fails when the configured trainer or averager is missing or refused.
func listPlugins(ctx context.Context, w io.Writer, cfg *config.Config, probe time.Duration) error {
	if ctx == nil {
		ctx = context.Background()
	}
	dirs := pluginDirs(cfg)
	list := pluginhost.List(dirs)
	lock, lockErr := pluginhost.LoadLock(cfg.Worker.PluginLock)
	host := pluginhost.New(pluginhost.Options{Dirs: dirs, Lock: cfg.Worker.PluginLock, StartTimeout: probe, Withhold: []string{envSecret, envSecretFile}})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tVERSION\tPROTOCOL\tCHECKSUM\tLOCK\tPATH")
	configured := map[pluginhost.Kind]config.Plugin{pluginhost.Trainer: cfg.Trainer, pluginhost.Averager: cfg.Averager}
	var problems []error
	found := map[pluginhost.Kind]bool{}
	for _, l := range list {
		version, protocol, checksum, lockState := "?", "?", "not listed", "not locked"
		var refused error
		switch {
		case l.Err != nil:
			checksum, refused = "refused", l.Err
		case l.Checksum != nil:
			checksum = "verified"
		}
		if e, ok := lock.Entry(l.Kind, l.Name); ok {
			lockState, version = "locked "+e.Version, e.Version
		}
		switch err := lock.Check(l.Located); {
		case lockErr != nil:
			lockState, refused = "lock unreadable", errors.Join(refused, lockErr)
		case refused == nil && err != nil:
			refused = err
		}
		if refused == nil && probe > 0 {
			p, err := host.Probe(ctx, l.Located, probe)
			if err != nil {
				refused = err
			} else {
				version, protocol = p.Description.Version, strconv.Itoa(p.Protocol)
				refused = lock.CheckProbe(l.Kind, l.Name, p)
			}
		}
		chosen := ""
		if c := configured[l.Kind]; c.Name == l.Name {
			chosen = " (configured)"
			found[l.Kind] = true
			if refused == nil && version != "?" {
				refused = pluginhost.CheckVersion(l.Kind, l.Name, version, c.Version)
			}
			if refused != nil {
				problems = append(problems, refused)
			}
		}
		if refused != nil {
			lockState += "; refused: " + refused.Error()
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%s\t%s\t%s\n", l.Kind, l.Name, chosen, version, protocol, checksum, lockState, l.Path)
	}
	if len(list) == 0 {
		fmt.Fprintln(tw, "no plugins found")
	}
	tw.Flush()
	for _, k := range []pluginhost.Kind{pluginhost.Trainer, pluginhost.Averager} {
		if !found[k] {
			problems = append(problems, fmt.Errorf("the configured %s plugin %q is missing: no %s in %v or on PATH",
				k, configured[k].Name, pluginhost.BinaryName(k, configured[k].Name), dirs))
		}
	}
	return errors.Join(problems...)
}

// pluginDirs is where a worker looks for plugins, before PATH: the config's
// plugin directory, then the one beside this executable.
func pluginDirs(cfg *config.Config) []string {
	dirs := []string{cfg.Worker.PluginDir}
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Join(filepath.Dir(exe), "plugins"))
	}
	return dirs
}
