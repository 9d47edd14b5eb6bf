package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/plugin"
)

func newValidateCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a config file and its plugins before a run, reporting every error",
		Long: `Checks a config file as a run would before any rank starts, and reports
every error at once: the core's keys, that the trainer and averager plugins
are found (in worker.plugin_dir, the plugins directory beside the cohort
binary, then PATH) and pass their SHA256SUMS and lock checks, that each
completes the plugin handshake, that its version satisfies the block's
version constraint, and that the block's settings fit the schema the plugin
declares (each key known, of its type, the required ones set). Each error
names the file, line and key. Exit status 0 means the file would run.`,
		Example: `  cohort validate cohort.hcl`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError("validate takes one config file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.LoadUnchecked(args[0])
			if err != nil {
				// A file that does not parse has nothing more to check.
				return failed(err)
			}
			if err := errors.Join(validate(cmd.Context(), cfg)...); err != nil {
				return failed(fmt.Errorf("%s is not valid:\n%w", args[0], err))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (trainer %q, averager %q)\n", args[0], cfg.Trainer.Name, cfg.Averager.Name)
			return nil
		},
	}
}

// validate runs every check of a loaded config and returns each failure.
func validate(ctx context.Context, cfg *config.Config) []error {
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return append(errs, checkPlugins(ctx, cfg)...)
}

// checkPlugins starts the configured trainer and averager briefly, as a
// worker would, and returns each failure: not found, refused by its
// checksums or lock, no handshake, a version outside the block's
// constraint, or settings its declared schema refuses (those name the
// file, line and key).
func checkPlugins(ctx context.Context, cfg *config.Config) []error {
	if ctx == nil {
		ctx = context.Background()
	}
	h := pluginhost.New(pluginhost.Options{
		Dirs:     pluginDirs(cfg),
		Withhold: []string{envSecret, envSecretFile},
		Lock:     cfg.Worker.PluginLock,
		Versions: map[pluginhost.Kind]string{
			pluginhost.Trainer:  cfg.Trainer.Version,
			pluginhost.Averager: cfg.Averager.Version,
		},
	})
	defer h.StopAll(context.Background())
	var errs []error
	check := func(kind string, p interface {
		Describe(context.Context) (plugin.Description, error)
	}, err error) {
		if err == nil {
			var d plugin.Description
			if d, err = p.Describe(ctx); err == nil {
				err = cfg.CheckPluginSettings(kind, d.Settings)
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	t, _, err := h.StartTrainer(ctx, cfg.Trainer.Name)
	check(plugin.KindTrainer, t, err)
	a, _, err := h.StartAverager(ctx, cfg.Averager.Name)
	check(plugin.KindAverager, a, err)
	return errs
}
