package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
)

func newPluginsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "plugins",
		Short: "List the plugins a worker would find, and their checksum status",
		Long: `Lists the trainer and averaging plugins a worker would find (the config's
worker.plugin_dir, then the plugins directory beside the cohort binary, then
PATH) and whether each would pass its SHA256SUMS check. A config file picks
one of each by name: trainer "NAME" {} and averager "NAME" {}.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			listPlugins(cmd.OutOrStdout(), cfg)
			return nil
		},
	}
}

// listPlugins writes a table of the plugins a worker with cfg would find.
func listPlugins(w io.Writer, cfg *config.Config) {
	list := pluginhost.List(pluginDirs(cfg))
	if len(list) == 0 {
		fmt.Fprintln(w, "no plugins found")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tSTATUS\tPATH")
	for _, l := range list {
		status := "ok"
		switch {
		case l.Err != nil:
			status = "refused: " + l.Err.Error()
		case l.Checksum != nil:
			status = "ok, checksum verified"
		}
		chosen := ""
		if (l.Kind == pluginhost.Trainer && l.Name == cfg.Trainer.Name) || (l.Kind == pluginhost.Averager && l.Name == cfg.Averager.Name) {
			chosen = " (configured)"
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\n", l.Kind, l.Name, chosen, status, l.Path)
	}
	tw.Flush()
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
