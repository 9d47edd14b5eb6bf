package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
)

const pluginsUsage = `usage: cohort plugins [--config FILE]

Lists the trainer and averaging plugins a worker would find (the config's
worker.plugin_dir, then the plugins directory beside the cohort binary, then
PATH) and whether each would pass its SHA256SUMS check. A config file picks
one of each by name: trainer "NAME" {} and averager "NAME" {}.

`

func pluginsCommand(args []string) int {
	fs := flag.NewFlagSet("plugins", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), pluginsUsage)
		fs.PrintDefaults()
	}
	cfgPath := fs.String("config", "", "HCL config file (default: the built-in configuration)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitCompleted
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cohort plugins: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	cfg := config.Default()
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath); err != nil {
			fmt.Fprintf(os.Stderr, "cohort plugins: %v\n", err)
			return exitFailed
		}
	}
	list := pluginhost.List(pluginDirs(cfg))
	if len(list) == 0 {
		fmt.Println("no plugins found")
		return exitCompleted
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
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
	return exitCompleted
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
